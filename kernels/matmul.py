"""Linear / matmul: `out = x @ w.T (+ bias)` with the tile chosen by the caller's selector.

Batch invariance: a row's result depends only on how its K reduction is cut and combined. Rows
are computed in fixed-shape tiles (on the CPU too: torch's fp32 CPU matmul changes a row's bits
with M), and K is cut into `split_k` contiguous ranges of whole BLOCK_K blocks whose fp32
partials are added in split order. With the tile pinned, a row's bits never see the batch; the
stock selection's split-K for small M is exactly what makes its bits follow the batch.
"""
from __future__ import annotations

from typing import Any

import torch

from detent_rl.kernels._triton import interpreting, tl, triton


@triton.jit
def _tile_offsets(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program `pid`'s rows and columns, tiles visited in groups of GROUP_M row tiles (L2 reuse)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def _dot_k_blocks(x_ptr, w_ptr, acc, offs_m, offs_n, k_start, num_blocks, M, N, K, stride_xm, stride_xk,
                  stride_wn, stride_wk, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """`acc` plus the products of `num_blocks` BLOCK_K blocks of K from `k_start`, in block order."""
    for kb in range(0, num_blocks):
        offs_k = k_start + kb * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
        if UPCAST:  # the CPU interpreter mis-computes tl.dot on 16-bit operands
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    return acc


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_xk,
                   stride_wn, stride_wk, stride_om, stride_on, k_blocks_per_split,
                   HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   IEEE: tl.constexpr, UPCAST: tl.constexpr):
    pid_k = tl.program_id(1)
    offs_m, offs_n = _tile_offsets(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = _dot_k_blocks(x_ptr, w_ptr, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), offs_m, offs_n,
                        pid_k * k_blocks_per_split * BLOCK_K, k_blocks_per_split, M, N, K, stride_xm, stride_xk,
                        stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, b_ptr, out_ptr, M, N, stride_om, stride_on,
                          HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):  # partials added in split order, always
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=mask, other=0.0).to(tl.float32)
    m = offs // N
    tl.store(out_ptr + m * stride_om + n * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


def check_operands(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    assert x.dim() == 2 and w.dim() == 2, \
        f"linear expects x [M, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}"
    assert x.shape[1] == w.shape[1], f"K mismatch: x {tuple(x.shape)} vs w {tuple(w.shape)}"
    assert x.dtype == w.dtype, f"dtype mismatch: {x.dtype} vs {w.dtype}"
    assert x.device == w.device, "x and w must be on one device"
    if bias is not None:
        assert bias.shape == (w.shape[0],) and bias.dtype == w.dtype and bias.device == w.device


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, block_m: int,
           block_n: int, block_k: int, group_m: int = 8, num_warps: int = 4, num_stages: int = 3,
           split_k: int = 1) -> torch.Tensor:
    """`x @ w.T + bias` for x [M, K], w [N, K] with the given (selected) tile."""
    check_operands(x, w, bias)
    assert split_k >= 1 and block_m > 0 and block_n > 0 and block_k > 0
    if x.is_cuda or interpreting():
        return _linear_triton(x, w, bias, block_m, block_n, block_k, group_m, num_warps, num_stages, split_k)
    return _linear_cpu(x, w, bias, block_m, block_k, split_k)


def _linear_triton(x, w, bias, block_m, block_n, block_k, group_m, num_warps, num_stages, split_k):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    k_blocks = triton.cdiv(K, block_k)
    per_split = triton.cdiv(k_blocks, split_k)
    ws = torch.empty((split_k, M, N), dtype=torch.float32, device=x.device) if split_k > 1 else out
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n), split_k)
    b = bias if bias is not None else out
    _matmul_kernel[grid](x, w, b, out, ws, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                         out.stride(0), out.stride(1), per_split, HAS_BIAS=bias is not None, SPLIT_K=split_k,
                         BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                         IEEE=x.dtype == torch.float32, UPCAST=interpreting() and x.dtype != torch.float32,
                         num_warps=num_warps, num_stages=num_stages)
    if split_k > 1:
        combine_splits(ws, bias, out)
    return out


def combine_splits(ws: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """`out = ws[0] + ws[1] + ... (+ bias)`, the fp32 partials [splits, M, N] added in split order."""
    splits, M, N = ws.shape
    block = 1024
    _splitk_reduce_kernel[(triton.cdiv(M * N, block),)](ws, bias if bias is not None else out, out, M, N,
                                                        out.stride(0), out.stride(1), HAS_BIAS=bias is not None,
                                                        SPLIT_K=splits, BLOCK=block)


def _linear_cpu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, block_m: int, block_k: int,
                split_k: int) -> torch.Tensor:
    """fp32 products and sums on fixed-shape row tiles, rounded once to x's dtype (as the Triton kernel's
    fp32 accumulator is); 16-bit CPU matmuls are also an order of magnitude slower than fp32 ones."""
    M, K = x.shape
    pad = (-M) % block_m
    xp = torch.cat([x, x.new_zeros(pad, K)]) if pad else x
    per_split = -(-(-(-K // block_k)) // split_k) * block_k  # whole K blocks per split
    wt = w.t().float()
    b = bias.float() if bias is not None else None
    tiles = []
    for i in range(0, xp.shape[0], block_m):  # fixed-shape tiles: a row never sees M
        xt = xp[i:i + block_m].float()
        if split_k == 1:
            acc = xt @ wt if b is None else torch.addmm(b, xt, wt)
        else:
            acc = None
            for s in range(split_k):  # fp32 partials, added in split order
                part = xt[:, s * per_split:(s + 1) * per_split] @ wt[s * per_split:(s + 1) * per_split]
                acc = part if acc is None else acc + part
            if b is not None:
                acc = acc + b
        tiles.append(acc.to(x.dtype))
    return torch.cat(tiles)[:M]


def tile_params(selection: Any) -> dict:
    """The `linear` keyword arguments of a matmul selection (`selection/matmul.py`'s tile)."""
    return {"block_m": selection.tile_block_m, "block_n": selection.tile_block_n,
            "block_k": selection.tile_block_k, "group_m": selection.tile_group_m,
            "num_warps": selection.tile_num_warps, "num_stages": selection.tile_num_stages,
            "split_k": selection.tile_split_k}


def linear_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 reference."""
    out = x.float() @ w.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
