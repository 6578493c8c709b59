"""Linear with a pinned K partition: `out = x @ w.T (+ bias)` whose bits are fixed by `chunk` alone.

Batch invariance through the reduction, not the tile. K is cut into chunks of `chunk` elements at
fixed positions; each chunk's products are summed into a fresh fp32 accumulator (tl.dot over its
BLOCK_K pieces), and the chunk sums are added in chunk order (the first, plus the second, plus ...),
then the bias, then one rounding. Every schedule performs exactly these fp32 operations for a row, so a
row's bits depend on `chunk` (and the data), never on M or on the schedule:

- `parallel=True` (decode, small M: a memory-bound call needs many CTAs): one program per (tile,
  chunk) writes its chunk sum to an fp32 workspace; split-K's combine kernel adds them in order.
- `parallel=False` (prefill and the trainer, large M: compute-bound, big tiles): one program per
  tile loops over the chunks, each into a fresh accumulator added to the running total in order.

Tile shapes (BLOCK_M/N/K, warps, stages) are free per call: on the H200 a `tl.dot` row does not
change with them (re-measured by tests/test_kernels_chunked_matmul_gpu.py on the 0.5B sites). What
selection must pin is `chunk`; the schedule and tile may follow M. This is the kernel issue 10 asks
for; it is not wired into the engine's selection yet.
"""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import interpreting, tl, triton
from detent_rl.kernels.matmul import _dot_k_blocks, _tile_offsets, check_operands, combine_splits


@triton.jit
def _chunked_matmul_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, M, N, K, num_chunks, stride_xm, stride_xk,
                           stride_wn, stride_wk, stride_om, stride_on, HAS_BIAS: tl.constexpr,
                           PARALLEL: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                           IEEE: tl.constexpr, UPCAST: tl.constexpr):
    offs_m, offs_n = _tile_offsets(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # each chunk starts a fresh accumulator
    if PARALLEL:
        c = tl.program_id(1)
        part = _dot_k_blocks(x_ptr, w_ptr, zero, offs_m, offs_n,
                             c * CHUNK, CHUNK // BLOCK_K, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                             BLOCK_K, IEEE, UPCAST)
        tl.store(ws_ptr + c * M * N + offs_m[:, None] * N + offs_n[None, :], part, mask=mask)
    else:
        total = _dot_k_blocks(x_ptr, w_ptr, zero, offs_m, offs_n, 0, CHUNK // BLOCK_K, M, N, K, stride_xm,
                              stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
        for c in range(1, num_chunks):  # chunk sums added in chunk order, each from a fresh accumulator
            total += _dot_k_blocks(x_ptr, w_ptr, zero, offs_m, offs_n,
                                   c * CHUNK, CHUNK // BLOCK_K, M, N, K, stride_xm, stride_xk, stride_wn,
                                   stride_wk, BLOCK_K, IEEE, UPCAST)
        if HAS_BIAS:
            total += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
                 total.to(out_ptr.dtype.element_ty), mask=mask)


def chunked_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, chunk: int,
                   parallel: bool, block_m: int, block_n: int, block_k: int, group_m: int = 8,
                   num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """`x @ w.T + bias` for x [M, K], w [N, K]: K partitioned into `chunk`-element chunks (the pin),
    computed by the parallel or the sequential schedule with the given tile (free per call)."""
    check_operands(x, w, bias)
    assert chunk > 0 and block_k > 0 and chunk % block_k == 0, f"chunk {chunk} must be whole BLOCK_K {block_k} blocks"
    if x.is_cuda or interpreting():
        return _chunked_triton(x, w, bias, chunk, parallel, block_m, block_n, block_k, group_m, num_warps,
                               num_stages)
    return _chunked_cpu(x, w, bias, chunk, block_m)


def _chunked_triton(x, w, bias, chunk, parallel, block_m, block_n, block_k, group_m, num_warps, num_stages):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    chunks = triton.cdiv(K, chunk)
    ws = torch.empty((chunks, M, N), dtype=torch.float32, device=x.device) if parallel else out
    b = bias if bias is not None else out
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    _chunked_matmul_kernel[(tiles, chunks if parallel else 1)](
        x, w, b, out, ws, M, N, K, chunks, x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0),
        out.stride(1), HAS_BIAS=bias is not None, PARALLEL=parallel, CHUNK=chunk, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, GROUP_M=group_m, IEEE=x.dtype == torch.float32,
        UPCAST=interpreting() and x.dtype != torch.float32, num_warps=num_warps, num_stages=num_stages)
    if parallel:  # the chunk sums added in chunk order: split-K's combine, one split per chunk
        combine_splits(ws, bias, out)
    return out


def _chunked_cpu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, chunk: int,
                 block_m: int) -> torch.Tensor:
    """The same fp32 operations in PyTorch on fixed-shape row tiles (torch's CPU matmul reads M)."""
    M, K = x.shape
    pad = (-M) % block_m
    xp = torch.cat([x, x.new_zeros(pad, K)]) if pad else x
    wt = w.t().float()
    tiles = []
    for i in range(0, xp.shape[0], block_m):
        xt = xp[i:i + block_m].float()
        total = xt[:, :chunk] @ wt[:chunk]
        for c in range(chunk, K, chunk):
            total += xt[:, c:c + chunk] @ wt[c:c + chunk]
        if bias is not None:
            total += bias.float()
        tiles.append(total.to(x.dtype))
    return torch.cat(tiles)[:M]
