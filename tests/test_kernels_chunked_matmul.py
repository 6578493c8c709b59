"""The chunked (pinned-K-partition) linear on the CPU: the reference, a row's bits independent of M
and of the schedule (parallel chunks vs sequential chunks, tile shapes), and a different chunk as the
negative control; the Triton code under the CPU interpreter (logic only: GPU bits are
tests/test_kernels_chunked_matmul_gpu.py's)."""
from __future__ import annotations


import pytest
import torch

from detent_rl.kernels.chunked_matmul import chunked_linear
from detent_rl.kernels.matmul import linear_ref
from interpreted import run_interpreted


def _data(n: int, k: int, dtype: torch.dtype, rows: int = 130):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    return torch.randn(rows, k, generator=g).to(dtype), w, torch.randn(n, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_rows_follow_the_chunk_alone(dtype):
    x, w, b = _data(96, 200, dtype)
    full = chunked_linear(x, w, b, chunk=64, parallel=False, block_m=32, block_n=64, block_k=32)
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert (full.float() - linear_ref(x, w, b).float()).abs().max().item() < tol
    bad = []
    for m in (1, 3, 17, 64, 129):
        for parallel, block_m in ((True, 16), (False, 64), (True, 128)):
            got = chunked_linear(x[:m], w, b, chunk=64, parallel=parallel, block_m=block_m, block_n=32, block_k=64)
            if not torch.equal(got, full[:m]):
                bad.append((m, parallel, block_m))
    assert not bad, f"rows changed with M or the schedule: {bad}"
    other = chunked_linear(x, w, b, chunk=32, parallel=False, block_m=32, block_n=64, block_k=32)
    assert not torch.equal(other, full), "another K partition must round differently (the control)"


def test_bad_chunks_are_refused():
    x, w, b = _data(8, 64, torch.float32, rows=2)
    with pytest.raises(AssertionError, match="whole BLOCK_K"):
        chunked_linear(x, w, b, chunk=48, parallel=True, block_m=16, block_n=16, block_k=32)


def test_triton_kernel_under_the_interpreter():
    # the tile stays fixed here, M and the schedule vary: the interpreter's tl.dot is a numpy matmul
    # per block, whose summation order follows the block's shape (the H200's tl.dot does not: the GPU
    # test measures that)
    code = r'''
import torch
from detent_rl.kernels.chunked_matmul import chunked_linear
from detent_rl.kernels.matmul import linear_ref
torch.manual_seed(0)
bad = []
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(37, 200).to(dtype); w = torch.randn(72, 200).to(dtype); b = torch.randn(72).to(dtype)
    ref = chunked_linear(x, w, b, chunk=64, parallel=False, block_m=16, block_n=32, block_k=32)
    err = (ref.float() - linear_ref(x, w, b).float()).abs().max().item()
    if err > (1e-3 if dtype == torch.float32 else 0.5):
        bad.append(("err", dtype, err))
    for m, parallel, bm, bk in ((1, True, 16, 32), (5, True, 16, 32), (37, True, 16, 32), (2, False, 16, 32)):
        got = chunked_linear(x[:m], w, b, chunk=64, parallel=parallel, block_m=bm, block_n=32, block_k=bk)
        if not torch.equal(got, ref[:m]):
            bad.append(("rows", dtype, m, parallel, bm, bk))
print("BAD", bad)
'''
    out = run_interpreted(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BAD []" in out.stdout, out.stdout
