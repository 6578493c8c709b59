"""Linear on the CPU: matches the reference, batch-invariant under the pinned tile, and the stock
selection (split-K for small M) visibly is not."""
from __future__ import annotations


import pytest
import torch

from detent_rl.kernels.matmul import linear, linear_ref, tile_params
from detent_rl.kernels.programs.matmul import matmul_program
from detent_rl.kernels.selections import Deployment
from detent_rl.selir.cache import JITCache
from detent_rl.selir.solver import solve
from interpreted import run_interpreted

# Qwen2-0.5B-class projections: qkv (896 -> 1152, with bias) and down (4864 -> 896)
SHAPES = [(1152, 896, True), (896, 4864, False)]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


# the matmul facts of a Qwen2-0.5B-class deployment on an H200 (8,192 rows per step, bf16)
QWEN2_05B = Deployment(num_heads=14, num_kv_heads=2, head_dim=64, hidden=896, vocab=151936)


def _selectors(n: int, k: int):
    """(stock, detent) selectors of the matmul site (n, k)."""
    sol = solve(matmul_program, QWEN2_05B.facts("matmul", {"n": n, "k": k}), cache=JITCache(enabled=False))
    return sol.stock(), sol.commit()


def _run(x, w, b, cfg):
    return linear(x, w, b, **tile_params(cfg))


def _weights(n, k, bias, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,bias", SHAPES)
@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_linear_matches_reference(dtype, n, k, bias, split_k):
    w, b = _weights(n, k, bias, dtype)
    x = torch.randn(37, k).to(dtype)
    out = linear(x, w, b, block_m=16, block_n=64, block_k=64, split_k=split_k)
    ref = linear_ref(x, w, b)
    err = (out.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1.0)
    assert err <= TOL[dtype], err


def _invariance_failures(sel, dtype, n, k, bias) -> list[str]:
    w, b = _weights(n, k, bias, dtype)
    g = torch.Generator().manual_seed(1)
    batch = torch.randn(300, k, generator=g).to(dtype)
    full = _run(batch, w, b, sel(300))
    failures = []
    for m in (1, 3, 17, 64):
        sub = _run(batch[:m], w, b, sel(m))
        for i in range(m):
            if not torch.equal(sub[i], full[i]):
                diff = (sub[i].float() - full[i].float()).abs().max().item()
                failures.append(f"row {i} in a batch of {m} vs 300: max |d| {diff:.3g}")
    # the same row at another position
    moved = _run(torch.cat([batch[5:6], batch[:40]]), w, b, sel(41))
    if not torch.equal(moved[0], full[5]):
        failures.append("row 5 moved to position 0 changed")
    return failures


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,bias", SHAPES)
def test_pinned_tile_is_batch_invariant_and_stock_is_not(dtype, n, k, bias):
    stock, detent = _selectors(n, k)
    assert _invariance_failures(detent, dtype, n, k, bias) == []
    stock_failures = _invariance_failures(stock, dtype, n, k, bias)
    assert stock_failures, "negative control: the stock selection (split-K below 32 rows) must change bits"


def test_plain_cpu_fp32_matmul_reads_the_batch():
    # why the CPU path tiles: torch's fp32 CPU matmul gives a row other bits for other M
    w, _ = _weights(1152, 896, False, torch.float32)
    x = torch.randn(300, 896)
    full = x @ w.t()
    assert any(not torch.equal((x[i:i + 1] @ w.t())[0], full[i]) for i in range(0, 300, 7))


def test_triton_kernel_under_the_interpreter():
    # correctness and row invariance of the Triton code path, run by Triton's CPU interpreter
    # (it proves nothing about GPU bits; the GPU tests do that)
    code = r'''
import torch
from detent_rl.kernels.matmul import linear, linear_ref, tile_params
torch.manual_seed(0)
bad = []
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(37, 200).to(dtype); w = torch.randn(72, 200).to(dtype); b = torch.randn(72).to(dtype)
    for sk in (1, 2, 3):
        out = linear(x, w, b, block_m=16, block_n=32, block_k=32, split_k=sk)
        err = (out.float() - linear_ref(x, w, b).float()).abs().max().item()
        if err > (1e-3 if dtype == torch.float32 else 0.5):
            bad.append(("err", dtype, sk, err))
        one = linear(x[5:6], w, b, block_m=16, block_n=32, block_k=32, split_k=sk)
        if not torch.equal(one[0], out[5]):
            bad.append(("row", dtype, sk))
print("BAD", bad)
'''
    out = run_interpreted(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BAD []" in out.stdout, out.stdout
