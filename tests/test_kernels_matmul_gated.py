"""The gated MLP's gate/up projection with SiLU-and-mul in its epilogue (`kernels/matmul_gated.py`): the two kernels'
bits (`linear`, then `silu_and_mul`) in one launch, under the interpreter (the logic: which columns a tile takes, the
chunk sums and the roundings in their order) and on the GPU (every Triton schedule of the 0.5B/1.5B gate/up sites,
and a model's rollout and rescore with it on). Controls: another K partition, or SiLU on the unrounded projection,
give other bits, so equality is not vacuous; the stock arm never takes it."""
from __future__ import annotations

import pytest
import torch

from detent_rl.kernels import matmul_gated
from detent_rl.kernels.matmul import launch_params
from detent_rl.models import load_model
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from interpreted import run_interpreted
from test_models import LIMITS, hf_model, save


def test_fusable_takes_the_triton_tile_and_leaves_the_rest_to_the_two_kernels():
    tile = dict(chunk=896, parallel=True, block_m=16, block_n=64, block_k=128, wgmma=False)
    assert matmul_gated.fusable(tile, 896)  # one chunk: the parallel form is the plain kernel
    assert matmul_gated.fusable({**tile, "chunk": 128, "parallel": False}, 896)  # sequential chunks
    assert not matmul_gated.fusable({**tile, "chunk": 128}, 896)  # parallel chunk sums: the combine kernel's
    assert not matmul_gated.fusable({**tile, "wgmma": True}, 896)  # the warpgroup kernel
    assert not matmul_gated.fusable({**tile, "block_n": 32}, 896)  # 16 columns a program: slower than two launches
    # the CPU outside the interpreter: the two functions composed, whatever the schedule
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 896, generator=g), torch.randn(128, 896, generator=g)
    from detent_rl.kernels.matmul import linear
    from detent_rl.kernels.silu_and_mul import silu_and_mul
    assert torch.equal(matmul_gated.gate_up_silu(x, w, None, block=64, **tile),
                       silu_and_mul(linear(x, w, None, **tile), block=64))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_gate_up_silu_matches_the_reference(dtype, tol):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(37, 896, generator=g).to(dtype)
    w, b = (torch.randn(256, 896, generator=g) / 30).to(dtype), torch.randn(256, generator=g).to(dtype)
    tile = dict(chunk=128, parallel=False, block_m=16, block_n=64, block_k=64, wgmma=False)
    got, want = matmul_gated.gate_up_silu(x, w, b, block=64, **tile), matmul_gated.gate_up_silu_ref(x, w, b)
    assert got.shape == (37, 128) and got.dtype == dtype
    err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1.0)
    assert err <= tol, err


def test_gate_up_silu_interpreted_gives_the_two_kernels_bits():
    # the interpreter's tl.dot sums every element in k order (`ordered_dot`), so the two launches' rows are
    # comparable bit for bit here whatever the tile; the GPU's own bits are the gpu tests' below
    out = run_interpreted(r'''
import torch
from detent_rl.kernels.matmul import linear
from detent_rl.kernels.matmul_gated import gate_up_silu, gate_up_silu_ref
from detent_rl.kernels.silu_and_mul import _silu_and_mul_triton
g = torch.Generator().manual_seed(0)
bad, seen = [], 0
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(37, 200, generator=g).to(dtype)  # K = 200: a partial last chunk of 64
    w = (torch.randn(96, 200, generator=g) / 8).to(dtype)  # d = 48: the last 32-column tile ragged
    b = torch.randn(96, generator=g).to(dtype)
    for tile in (dict(chunk=64, parallel=False, block_m=16, block_n=64, block_k=32),  # chunks in sequence
                 dict(chunk=256, parallel=True, block_m=16, block_n=64, block_k=32),  # one chunk
                 dict(chunk=64, parallel=False, block_m=32, block_n=64, block_k=64)):  # a chunk of one block
        for bias in (None, b):
            for m in (1, 5, 37):
                launch = dict(tile, group_m=8, num_warps=4, num_stages=3, wgmma=False, swap_ab=False,
                              persistent=False)
                two = _silu_and_mul_triton(linear(x[:m], w, bias, **launch), 64)
                one = gate_up_silu(x[:m], w, bias, block=64, **launch)
                seen += 1
                if not torch.equal(one, two):
                    bad.append((str(dtype), tile["chunk"], tile["block_k"], bias is not None, m))
                want = gate_up_silu_ref(x[:m], w, bias).float()
                if (one.float() - want).abs().max() > (1e-4 if dtype == torch.float32 else 3e-2) * want.abs().max():
                    bad.append(("reference", str(dtype), tile["chunk"], m))
    # controls: another partition's sums, and SiLU on the unrounded projection, differ somewhere
    base = dict(parallel=False, block_m=16, block_n=64, block_k=32, group_m=8, num_warps=4, num_stages=3,
                wgmma=False, swap_ab=False, persistent=False)
    if dtype == torch.float32:  # (in bf16 the output's rounding hides an fp32 ulp of the sums)
        other = gate_up_silu(x, w, b, block=64, chunk=32, **base)
        if torch.equal(other, gate_up_silu(x, w, b, block=64, chunk=64, **base)):
            bad.append("control: chunk 32 gave chunk 64's bits")
    else:
        p = linear(x, w, b, chunk=64, out_dtype=torch.float32, **base)
        unrounded = (torch.nn.functional.silu(p[:, :48]) * p[:, 48:]).to(dtype)
        if torch.equal(unrounded, gate_up_silu(x, w, b, block=64, chunk=64, **base)):
            bad.append("control: SiLU on the unrounded projection gave the same bits")
print("SEEN", seen, "BAD", bad)
''')
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SEEN 36 BAD []" in out.stdout, out.stdout


# ---- the GPU ----------------------------------------------------------------------------------------------------

GATE_UP = [(9728, 896), (17920, 1536)]  # the 0.5B and 1.5B gate/up sites: [2d, K]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("n,k", GATE_UP, ids=["gate_up05", "gate_up15"])
def test_gpu_gate_up_silu_gives_the_two_kernels_bits_under_every_triton_schedule(n, k, dtype):
    """Every Triton tile of the schedule table it computes (bf16; fp32 on two), K whole (the committed tuples'
    gate/up partition) and in chunks of 128 in sequence."""
    from detent_rl.kernels.matmul import linear
    from detent_rl.kernels.programs.matmul import TILE_CHOICES
    from detent_rl.kernels.silu_and_mul import silu_and_mul
    from test_kernels_matmul_gpu import _data
    x, w, _ = _data(n, k, False, dtype, rows=512)
    tiles = sorted({(t.parallel, t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages)
                    for choices in TILE_CHOICES.values() for t in choices.values() if not t.wgmma})
    if dtype == torch.float32:
        tiles = tiles[:2]
    bad, seen = [], 0
    for i, (parallel, bm, bn, bk, warps, stages) in enumerate(tiles):
        for chunk in (k, 128) if i == 0 else (k,):
            launch = dict(chunk=chunk, parallel=parallel and chunk >= k, block_m=bm, block_n=bn, block_k=bk,
                          group_m=8, num_warps=warps, num_stages=stages, wgmma=False, swap_ab=False, persistent=False)
            if not matmul_gated.fusable(launch, k):
                continue
            for m in (1, 32, 512):
                seen += 1
                two = silu_and_mul(linear(x[:m], w, None, **launch), block=1024)
                one = matmul_gated.gate_up_silu(x[:m], w, None, block=1024, **launch)
                if not torch.equal(one, two):
                    rows = (one != two).any(dim=1).nonzero().flatten().tolist()
                    bad.append(f"{launch} at M = {m}: rows {rows[:4]}")
    assert seen >= (6 if dtype == torch.float32 else 20) and bad == []
    want = matmul_gated.gate_up_silu_ref(x, w).float()
    got = matmul_gated.gate_up_silu(x, w, None, block=1024, chunk=k, parallel=False, block_m=64, block_n=128,
                                    block_k=64, wgmma=False).float()
    assert (got - want).abs().max() <= (1e-4 if dtype == torch.float32 else 3e-2) * want.abs().max()
    # control: SiLU on the unrounded projection (what a fusion that skipped the rounding would give)
    p = linear(x, w, None, chunk=k, parallel=False, block_m=64, block_n=128, block_k=64, out_dtype=torch.float32)
    d = n // 2
    unrounded = (torch.nn.functional.silu(p[:, :d]) * p[:, d:]).to(dtype)
    fused = matmul_gated.gate_up_silu(x, w, None, block=1024, chunk=k, parallel=False, block_m=64, block_n=128,
                                      block_k=64, wgmma=False)
    assert dtype == torch.float32 or not torch.equal(unrounded, fused), "control: the rounding made no difference"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_engine_with_the_gated_mlp_keeps_every_bit(tmp_path, dtype, monkeypatch):
    """A rollout with it on (captured decode graphs included) gives the rollout with it off bit for bit, and the
    trainer's rescore (on: fused; with a gradient: the two kernels) gives the rollout's logprobs."""
    from detent_rl.models.runner import completion_logprobs
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", device="cuda", dtype=dtype, **LIMITS)
    mlp = model.model.layers[0].mlp
    assert any(matmul_gated.fusable(launch_params(mlp.gate_up_proj._select(m)), mlp.gate_up_proj.weight.shape[1])
               for m in (1, 6, 40)), "no decode or prefill size of this model takes the fused kernel"
    prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(6)]
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=8) for i in range(6)]
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("DETENT_GATED_MLP", flag)
        runs[flag] = [(s.tokens, s.logprobs) for s in Engine(model, num_blocks=64).generate(prompts, params)]
    assert runs["1"] == runs["0"]
    seqs = [(t, len(p)) for (t, _), p in zip(runs["1"], prompts)]
    with torch.no_grad():
        rescored = completion_logprobs(model, seqs, [1.0] * len(seqs))
    assert [r.tolist() for r in rescored] == [lp for _, lp in runs["1"]]
    for p in model.parameters():
        p.requires_grad_(True)
    trained = completion_logprobs(model, seqs, [1.0] * len(seqs))
    assert [t.tolist() for t in trained] == [lp for _, lp in runs["1"]]


@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_the_stock_arm_never_takes_it(tmp_path, arm, monkeypatch):
    """With the flag on, the pinned arm's MLP calls the fused op and the stock arm's never does (a stock engine runs
    cuBLAS and the separate SiLU-and-mul kernel)."""
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, dtype=torch.float32, **LIMITS)
    calls = []
    real = matmul_gated.gate_up_silu
    monkeypatch.setattr(matmul_gated, "gate_up_silu", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv("DETENT_GATED_MLP", "1")
    prompts, params = [list(range(5, 30))], [SamplingParams(seed=1, temperature=1.0, max_tokens=4)]
    with_flag = Engine(model, num_blocks=16).generate(prompts, params)[0]
    assert bool(calls) == (arm == "detent")
    monkeypatch.setenv("DETENT_GATED_MLP", "0")
    calls.clear()
    without = Engine(model, num_blocks=16).generate(prompts, params)[0]
    assert not calls and (with_flag.tokens, with_flag.logprobs) == (without.tokens, without.logprobs)
