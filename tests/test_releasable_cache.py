"""The KV cache whose memory a colocated update takes (`rollout.release_memory`): laid out in memory the engine
gives back at kept addresses (`rollout/vmm.py`, CUDA), its captured graphs survive a release with the same bits;
without it (the CPU, or `releasable` off) a release frees the storage and drops the graphs."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.rollout import vmm
from detent_rl.rollout.engine import Engine
from test_engine import _release_and_resume, _requests
from test_models import LIMITS, hf_model, save


def test_the_kv_cache_lays_out_in_given_memory(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, **LIMITS)
    need = model.kv_cache_bytes(9)
    assert need == sum(k.numel() * k.element_size() * 2 for k, _ in model.allocate_kv_cache(9))
    memory = torch.full((need + 100,), 7, dtype=torch.uint8)
    caches = model.allocate_kv_cache(9, memory=memory)
    plain = model.allocate_kv_cache(9)
    assert [(k.shape, v.shape, k.dtype) for k, v in caches] == [(k.shape, v.shape, k.dtype) for k, v in plain]
    assert int(memory[:need].sum()) == 0 and int(memory[need:].sum()) == 7 * 100  # zeroed, nothing past it
    base = memory.data_ptr()
    spans = sorted((t.data_ptr() - base, t.numel() * t.element_size()) for kv in caches for t in kv)
    assert spans[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))  # tiled, no overlap
    k1 = caches[1][0]
    k1.fill_(1.0)  # written through to the memory at its span, and nowhere else
    at, n = k1.data_ptr() - base, k1.numel() * k1.element_size()
    assert torch.equal(memory[at:at + n].view(model.dtype), k1.flatten())
    assert int(memory[:at].count_nonzero()) == int(memory[at + n:need].count_nonzero()) == 0
    for bad, what in ((torch.zeros(need - 1, dtype=torch.uint8), "at least"),
                      (torch.zeros(need, dtype=torch.int8), "uint8")):
        with pytest.raises(ValueError, match=what):
            model.allocate_kv_cache(9, memory=bad)


def test_off_cuda_a_releasable_engine_frees_the_storage_and_keeps_the_bits(tmp_path):
    # off CUDA `releasable` falls back to freeing the cache's storage
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, **LIMITS)
    engine = Engine(model, num_blocks=64, chunk_size=16, releasable=True)
    assert engine.memory is None
    assert _release_and_resume(engine) == []
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        vmm.ReleasableMemory(1 << 20, "cpu")


def _graph_ids(engine: Engine) -> dict:
    return {**{("decode",) + tuple(k): id(g) for k, g in engine.graphs.graphs.items()},
            **{("pieces", k): id(g) for k, g in engine.steps.graphs.items()}}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_released_cache_keeps_its_graphs_and_bits(tmp_path, dtype):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=dtype, device="cuda", **LIMITS)
    prompts, params = _requests(6, seed=3)
    engine = Engine(model, num_blocks=64, chunk_size=16, cuda_graphs=True, step_graphs=True, releasable=True)
    assert engine.memory is not None and engine.memory.mapped
    first = engine.generate(prompts, params)
    captured = _graph_ids(engine)
    assert any(k[0] == "decode" for k in captured) and any(k[0] == "pieces" for k in captured)
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    freed = engine.release_memory()
    assert freed >= model.kv_cache_bytes(65) and not engine.memory.mapped
    assert torch.cuda.mem_get_info()[0] - free >= freed - (2 << 20), "the physical memory went back to the device"
    after = engine.generate(prompts, params)
    assert not any(s.num_cached for s in after), "the prefix cache outlived the pages it pointed to"
    assert [(s.completion, s.logprobs) for s in after] == [(s.completion, s.logprobs) for s in first]
    assert _graph_ids(engine) == captured, "a graph was captured again: the release moved the cache"
    range_ = weakref.ref(engine.memory._range)  # the reserved range goes with its engine (unmapped, unreserved)
    del engine
    gc.collect()
    assert range_() is None, "the cache's address range outlived its engine"
    # control: a plain engine's release drops its graphs (they hold the freed cache's addresses)
    plain = Engine(model, num_blocks=64, chunk_size=16, cuda_graphs=True, step_graphs=True)
    plain.generate(prompts, params)
    assert plain.memory is None and _graph_ids(plain)
    plain.release_memory()
    assert _graph_ids(plain) == {}


def test_the_release_bench_runs_both_engines_with_the_same_bits(monkeypatch, capsys):
    """`bench/release_bench.py` (the plain engine's recaptures after a release against the kept graphs): a line per
    engine, each giving the first batch's bits after its release (on the CPU neither keeps its addresses)."""
    import importlib.util
    import sys
    from pathlib import Path
    bench = Path(__file__).resolve().parent.parent / "bench" / "release_bench.py"
    spec = importlib.util.spec_from_file_location("release_bench", bench)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", ["release_bench.py", "--model", "tiny", "--prompts", "2", "--samples", "2",
                                      "--prompt-len", "12", "--new-tokens", "5", "--rounds", "1",
                                      "--max-context", "64"])
    mod.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("releasable=")[1].split(" ")[0] for line in lines] == ["False", "True"]
    assert all("cache at kept addresses: False" in line and "bits the same" in line for line in lines)
    monkeypatch.setattr(sys, "argv", ["release_bench.py", "--model", "tiny", "--prompt-len", "60", "--new-tokens",
                                      "5", "--max-context", "64"])
    with pytest.raises(SystemExit):
        mod.main()
    assert "exceed --max-context 64" in capsys.readouterr().err
