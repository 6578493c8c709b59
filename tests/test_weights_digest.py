"""The weight sync's digest (`models.weights.weights_digest`): equal to a plain-Python rendering of its
definition (so the GPU's and the CPU's integer arithmetic can be held to one value), independent of how
the words are chunked, and one flipped bit in any tensor is caught and named; the rollout worker
refuses an update whose weights arrive changed. GPU: the same digest as the CPU's for the same bytes."""
from __future__ import annotations

import pytest
import torch

import detent_rl.models.weights as W
from detent_rl.models.weights import WeightsDigest, weights_digest

M64 = (1 << 64) - 1


def _python_digest(named: dict[str, torch.Tensor], key: int) -> dict[str, str]:
    """The definition, word by word in Python integers."""
    def fmix(h: int) -> int:
        h ^= h >> 33
        h = h * 0xFF51AFD7ED558CCD & M64
        h ^= h >> 33
        h = h * 0xC4CEB9FE1A85EC53 & M64
        return h ^ (h >> 33)
    out = {}
    for name, t in named.items():
        b = bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())
        b += bytes(-len(b) % 8)
        words = [int.from_bytes(b[i:i + 8], "little") for i in range(0, len(b), 8)]
        lanes = [(fmix(key + 2 * j + 1), fmix(key + 2 * j + 2) | 1) for j in range(2)]
        out[name] = "".join(f"{sum(fmix(((w ^ k) + (i + 1) * s) & M64) for i, w in enumerate(words)) & M64:016x}"
                            for k, s in lanes)
    return out


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(37, 5, generator=g).bfloat16(), "b": torch.randn(3, generator=g),
            "c": torch.randn(1000, generator=g).half(), "d": torch.zeros(0), "e": torch.tensor(2.0)}


def test_digest_is_its_definition_and_chunking_does_not_matter(monkeypatch):
    w = _weights()
    d = weights_digest(w, key=7)
    want = _python_digest(w, 7)
    assert [n for n, _ in d.tensors] == sorted(w) and all(e.endswith(want[n]) for n, e in d.tensors)
    monkeypatch.setattr(W, "CHUNK_WORDS", 13)  # tensors split across passes and passes across tensors
    assert weights_digest(w, key=7) == d
    assert weights_digest(dict(reversed(list(w.items()))), key=7) == d  # name order, not insertion order
    assert weights_digest(w, key=8).hex != d.hex and len(d.hex) == 32


def test_one_flipped_bit_in_any_tensor_is_caught_and_named():
    w = _weights()
    base = weights_digest(w)
    for name, t in w.items():
        for index in range(0, t.numel() * t.element_size() * 8, 61):  # bits across the tensor, every word
            bad = t.clone()
            bad.reshape(-1).view(torch.uint8)[index // 8] ^= 1 << index % 8
            got = weights_digest({**w, name: bad})
            assert got.differing(base) == [name], (name, index)
    shape = weights_digest({**w, "a": w["a"].reshape(5, 37)})
    dtype = weights_digest({**w, "b": w["b"].double()})
    assert shape.differing(base) == ["a"] and dtype.differing(base) == ["b"]
    assert weights_digest({k: v for k, v in w.items() if k != "d"}).differing(base) == ["d"]
    assert WeightsDigest((), 1).hex != WeightsDigest((), 2).hex


def test_the_rollout_worker_refuses_a_changed_update(tmp_path):
    from detent_rl.config import RolloutSection
    from detent_rl.workers import ModelSpec, RolloutWorker, WeightUpdate
    from test_models import LIMITS, hf_model, save
    path = save(hf_model("qwen2"), tmp_path / "m")
    spec = ModelSpec(str(path), "detent", "cpu", "float32", **LIMITS)
    worker = RolloutWorker(spec, RolloutSection(prompts_per_step=1, samples_per_prompt=1, max_new_tokens=4))
    sent = {n: p.detach().clone() + 0.5 for n, p in worker.model.named_parameters()}
    assert worker.update_weights(WeightUpdate(sent, weights_digest(sent))) == weights_digest(sent).hex
    name = sorted(sent)[3]
    damaged = {**sent, name: sent[name].clone()}
    damaged[name].reshape(-1)[-1] += 1.0  # changed on the way
    with pytest.raises(RuntimeError, match=f"differ from the trainer's in 1 tensor\\(s\\): {name}"):
        worker.update_weights(WeightUpdate(damaged, weights_digest(sent)))


def test_the_triton_pass_is_the_definition_interpreted():
    """kernels/digest.py (the GPU's method) under Triton's CPU interpreter, with programs of a few
    words so that tensors span several: the definition's value, and a flipped bit caught and named."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
import detent_rl.kernels.digest as D
from detent_rl.models.weights import weights_digest
from test_weights_digest import _python_digest, _weights
D.WORDS_PER_PROGRAM, D.BLOCK = 32, 8
w = {**_weights(), "f": torch.arange(300, dtype=torch.int32)}
d = weights_digest(w, key=7, method="triton")
want = _python_digest(w, 7)
assert all(e.endswith(want[n]) for n, e in d.tensors), "not the definition"
assert d == weights_digest(w, key=7, method="torch")
bad = w["f"].clone()
bad.view(torch.uint8)[1001] ^= 4
assert weights_digest({**w, "f": bad}, key=7, method="triton").differing(d) == ["f"]
print("ok")
""")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.gpu
def test_gpu_digest_equals_the_cpu_digest():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    w = _weights()
    # several passes and many programs on the device; an odd byte count (padded words)
    big = {"big": torch.randn(3000, 1001).bfloat16(), "odd": torch.randn(7).half(), **w}
    on_gpu = {k: v.cuda() for k, v in big.items()}
    cpu = weights_digest(big)
    assert weights_digest(on_gpu) == cpu and weights_digest(on_gpu, method="torch") == cpu
    bad = on_gpu["big"].clone()
    bad.view(-1).view(torch.uint8)[4_000_001] ^= 1
    assert weights_digest({**on_gpu, "big": bad}).differing(cpu) == ["big"]


def test_ipc_transport_refuses_host_tensors():
    from detent_rl.ipc import CudaIpcTensors
    with pytest.raises(ValueError, match="not on a GPU: b"):
        CudaIpcTensors({"b": torch.zeros(2)})


_IPC_CHILD = """
import pickle, sys, torch
from detent_rl.models.weights import weights_digest
update = pickle.loads(sys.stdin.buffer.read())
mine = {n: torch.empty_like(t).copy_(t) for n, t in update.weights.items()}  # device to device
print(weights_digest(mine).hex, weights_digest(mine) == update.digest, next(iter(update.weights.values())).is_cuda)
"""


@pytest.mark.gpu
def test_gpu_weights_cross_processes_by_cuda_ipc():
    """A trainer worker's update with the "ipc" transport, pickled as Ray would, opened by another
    process on the same GPU: the tensors arrive on the GPU without a host copy and digest to the
    trainer's value; a host-copy update pickles to the tensors' bytes (the control: over 100x larger)."""
    import pickle
    import subprocess
    import sys
    from detent_rl.ipc import CudaIpcTensors
    from detent_rl.workers import WeightUpdate
    w = {k: v.cuda() for k, v in {"big": torch.randn(2000, 1000).bfloat16(), **_weights()}.items() if v.numel()}
    update = WeightUpdate(CudaIpcTensors(w), weights_digest(w))
    blob = pickle.dumps(update)
    host = pickle.dumps(WeightUpdate({k: v.cpu() for k, v in w.items()}, update.digest))
    assert len(blob) * 100 < len(host)
    proc = subprocess.run([sys.executable, "-P", "-c", _IPC_CHILD], input=blob, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().split() == [update.digest.hex, "True", "True"]
