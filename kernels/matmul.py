"""Linear / matmul: `out = x @ w.T (+ bias)` whose bits are fixed by one value, the K partition `chunk`.

Batch invariance through the reduction, not the tile. K is cut into chunks of `chunk` elements at
fixed positions; each chunk's products are summed into a fresh fp32 accumulator (tl.dot over its
BLOCK_K pieces), the chunk sums are added in chunk order (the first, plus the second, plus ...), then
the bias, then one rounding. Every schedule performs exactly these fp32 operations for a row, so a
row's bits depend on `chunk` (and the data), never on M or on the schedule:

- `parallel=True` (decode, small M: a memory-bound call needs many CTAs): one program per (tile,
  chunk) writes its chunk sum to an fp32 workspace; `combine_splits` adds them in order.
- `parallel=False` (prefill and the trainer, large M: compute-bound, big tiles): one program per
  tile loops over the chunks, each into a fresh accumulator added to the running total in order.
  With `wgmma=True` on Hopper the same sequential sums run in `matmul_wgmma`'s kernel, which issues
  the warpgroup MMAs itself and waits for them once a chunk instead of once a block; so can the
  parallel form's chunk sums (TMA loads, an fp32 workspace the same `combine_splits` adds).

Tile shapes (BLOCK_M/N/K, warps, stages) are free per call: on the H200 a `tl.dot` row does not
change with them (measured on every 0.5B/1.5B site by tests/test_kernels_matmul_gpu.py). So the
selection program (`programs/matmul.py`) declares the tile and the parallel/sequential choice its
schedule, which may follow M, and the cut pins `chunk` alone. A split-K GEMM is the parallel form
with `chunk = K / splits`, one chunk (`chunk >= K`) a plain GEMM: what stock engines vary with M.
On the CPU the same operations run on fixed-shape row tiles (torch's fp32 CPU matmul reads M).
"""
from __future__ import annotations

from typing import Any

import torch

from detent_rl.kernels._triton import env, interpreting, pdl, pdl_enter, tl, triton
from detent_rl.kernels.launch import launch
from detent_rl.kernels.matmul_wgmma import applies as wgmma_applies
from detent_rl.kernels.matmul_wgmma import tile_fits as wgmma_tile_fits
from detent_rl.kernels.matmul_wgmma_plan import plan_wgmma


@triton.jit
def tile_ids(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program `pid`'s row and column tile, tiles visited in groups of GROUP_M row tiles (L2 reuse)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % group) % size_m, (pid % group) // size_m


@triton.jit
def _tile_offsets(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program `pid`'s rows and columns (`tile_ids`)."""
    pid_m, pid_n = tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def _program_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                     GRID3: tl.constexpr):
    """This program's rows and columns. GRID3 (GROUP_M 1, the decode tiles' row-major order) reads them off a
    3-D grid (row tile, chunk, column tile): no integer division by a run-time value on the way to the first
    load, where `tile_ids` takes two (a latency-bound call waits on them). The same tiles either way, in
    another launch order: bit-neutral."""
    if GRID3:
        return (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M),
                tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N))
    return _tile_offsets(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)


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
def _matmul_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, M, N, K, num_chunks, stride_xm, stride_xk,
                   stride_wn, stride_wk, stride_om, stride_on, HAS_BIAS: tl.constexpr, PARALLEL: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, FLAT: tl.constexpr,
                   PDL: tl.constexpr, GRID3: tl.constexpr = False):
    pdl_enter(PDL)
    offs_m, offs_n = _program_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M, GRID3)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # each chunk starts a fresh accumulator
    if PARALLEL:
        c = tl.program_id(1)
        part = _dot_k_blocks(x_ptr, w_ptr, zero, offs_m, offs_n, c * CHUNK, CHUNK // BLOCK_K, M, N, K,
                             stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
        tl.store(ws_ptr + c * M * N + offs_m[:, None] * N + offs_n[None, :], part, mask=mask)
    elif FLAT:  # one loop over every K block (one software pipeline), the chunk sum folded at chunk ends
        total = zero
        acc = zero
        for kb in range(0, num_chunks * (CHUNK // BLOCK_K)):
            acc = _dot_k_blocks(x_ptr, w_ptr, acc, offs_m, offs_n, kb * BLOCK_K, 1, M, N, K, stride_xm,
                                stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
            if kb % (CHUNK // BLOCK_K) == CHUNK // BLOCK_K - 1:
                total += acc  # 0 + the first chunk's sum is that sum: the same operations as below
                acc = zero
    else:
        total = _dot_k_blocks(x_ptr, w_ptr, zero, offs_m, offs_n, 0, CHUNK // BLOCK_K, M, N, K, stride_xm,
                              stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
        for c in range(1, num_chunks):  # chunk sums added in chunk order, each from a fresh accumulator
            total += _dot_k_blocks(x_ptr, w_ptr, zero, offs_m, offs_n, c * CHUNK, CHUNK // BLOCK_K, M, N, K,
                                   stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
    if not PARALLEL:
        if HAS_BIAS:
            total += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
                 total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, b_ptr, out_ptr, M, N, stride_ws, stride_om, stride_on,
                          HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):  # partials added in split order, always
        acc += tl.load(ws_ptr + s * stride_ws + offs, mask=mask, other=0.0)
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


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, chunk: int, parallel: bool,
           block_m: int, block_n: int, block_k: int, group_m: int = 8, num_warps: int = 4,
           num_stages: int = 3, flat: bool = False, wgmma: bool = False, swap_ab: bool = False,
           persistent: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`x @ w.T + bias` for x [M, K], w [N, K]: K cut into `chunk`-element chunks (what fixes the
    bits; `chunk >= K` is one chunk), computed by the parallel or the sequential schedule with the
    given tile (free per call: neither changes a row's bits). `flat` runs the sequential schedule as
    one loop over all K blocks that folds each chunk's sum into the total at the chunk's end (one
    software pipeline instead of one per chunk; the same fp32 operations). Not in the selection's
    schedule table yet: bench/matmul_sweep.py --flat measures it first. `out_dtype` torch.float32 keeps
    the fp32 sum unrounded (a row-parallel rank's partial, which the TP-invariant fold adds to its peers'
    in chunk order: models/parallel.py); default x's dtype. `swap_ab` (with `wgmma`) computes each tile
    transposed in the warpgroup kernel (`matmul_wgmma`); where that kernel does not run, the same tile
    runs the Triton kernel: the same bits. `persistent` (with `wgmma`) runs the warpgroup kernel's tiles a
    few to a program, as many programs as the SMs hold (bit-neutral too).

    A CUDA call that took the warpgroup kernel keeps its plan under a key of everything the checks and the
    plan read (`_ROUTES`): the same call again (a step's next layer, the next step) goes straight to the plan,
    ~10 µs of host time less (docs/BENCHMARKS.md, session 33)."""
    route = None
    if x.is_cuda:
        held = None if bias is None else (bias.shape, bias.dtype, bias.device, bias.data_ptr() % 16)
        route = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, w.shape, w.stride(), w.dtype, w.device,
                 w.data_ptr() % 16, held, chunk, parallel, block_m, block_n, block_k, group_m, num_stages, wgmma,
                 swap_ab, persistent, out_dtype, env("DETENT_PDL", "1"))
        plan = _ROUTES.get(route)
        if plan is not None:
            return plan(x, w, bias)
    check_operands(x, w, bias)
    assert chunk > 0 and block_m > 0 and block_n > 0 and block_k > 0
    assert chunk % block_k == 0, f"chunk {chunk} must be whole BLOCK_K {block_k} blocks"
    chunk = min(chunk, -(-x.shape[1] // block_k) * block_k)  # past K a chunk only adds exact zeros
    if not parallel and block_k == chunk:
        # a chunk of one tl.dot added to the running total (or to the bias) is folded by Triton into
        # one dot that accumulates onto it (`dot(a, b, 0) + t -> dot(a, b, t)`): other bits (312 of
        # 622,592 outputs differed on the H200). Two blocks per chunk keep the chunk's own sum.
        block_k //= 2
    out_dtype = out_dtype or x.dtype
    split = parallel and chunk < x.shape[1]  # the parallel form: whole tiles a chunk, into an fp32 workspace
    if (wgmma and out_dtype == x.dtype and x.is_cuda and wgmma_applies(x, w, block_k)
            and (not split or (not swap_ab and w.shape[0] % 4 == 0))
            and wgmma_tile_fits(block_m, block_n, chunk < x.shape[1] and not split, swap_ab)):
        plan = plan_wgmma(x, w, bias, chunk=chunk, block_k=block_k, group_m=group_m, num_buffers=num_stages,
                          pdl=pdl(x)["PDL"], block_m=block_m, block_n=block_n, swap_ab=swap_ab, persistent=persistent,
                          split=split)
        if route is not None:
            if len(_ROUTES) >= _MAX_ROUTES:
                _ROUTES.clear()
            _ROUTES[route] = plan
        return plan(x, w, bias)
    if x.is_cuda or interpreting():
        return _linear_triton(x, w, bias, chunk, parallel, block_m, block_n, block_k, group_m, num_warps,
                              num_stages, flat, out_dtype)
    return _linear_cpu(x, w, bias, chunk, out_dtype)


_MAX_ROUTES = 8192
GRID_YZ = 65535  # a CUDA grid's second and third axes hold this many programs
_ROUTES: dict = {}  # a CUDA call's key (`linear`) -> the warpgroup plan (`matmul_wgmma_plan._Plan`) that runs it


def _linear_triton(x, w, bias, chunk, parallel, block_m, block_n, block_k, group_m, num_warps, num_stages,
                   flat=False, out_dtype=None):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return out
    chunks = triton.cdiv(K, chunk)
    parallel = parallel and chunks > 1  # one chunk: nothing to combine
    ws = torch.empty((chunks, M, N), dtype=torch.float32, device=x.device) if parallel else out
    b = bias if bias is not None else out
    m_tiles, n_tiles, units = triton.cdiv(M, block_m), triton.cdiv(N, block_n), chunks if parallel else 1
    grid3 = group_m == 1 and n_tiles <= GRID_YZ  # (a grid's third axis holds 65,535 column tiles)
    grid = (m_tiles, units, n_tiles) if grid3 else (m_tiles * n_tiles, units)
    launch(_matmul_kernel, grid,
        x, w, b, out, ws, M, N, K, chunks, x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0),
        out.stride(1), HAS_BIAS=bias is not None, PARALLEL=parallel, CHUNK=chunk, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, IEEE=x.dtype == torch.float32,
        UPCAST=interpreting() and x.dtype != torch.float32, FLAT=flat and not parallel and chunks > 1, GRID3=grid3,
        num_warps=num_warps, num_stages=num_stages, **pdl(x))
    if parallel:  # the chunk sums added in chunk order
        combine_splits(ws, bias, out)
    return out


def combine_splits(ws: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> tuple:
    """`out = ws[0] + ws[1] + ... (+ bias)`, the fp32 partials [splits, rows >= M, N] (out's first M
    rows of each; contiguous) added in split order. Returns the launch (kernel, grid, arguments, keyword
    arguments), for a caller that records it (`matmul_wgmma_plan`)."""
    M, N = out.shape
    splits = ws.shape[0]
    assert ws.shape[1] >= M and ws.shape[2] == N and ws.is_contiguous()
    block = 1024
    grid = (triton.cdiv(M * N, block),)
    args = (ws, bias if bias is not None else out, out, M, N, ws.stride(0), out.stride(0), out.stride(1))
    meta = dict(HAS_BIAS=bias is not None, SPLIT_K=splits, BLOCK=block)
    launch(_splitk_reduce_kernel, grid, *args, **meta, **pdl(out))
    return _splitk_reduce_kernel, grid, args, {**meta, **pdl(out)}


CPU_BLOCK_M = 16  # the CPU path's fixed row tile: torch's CPU fp32 matmul reads M


def _linear_cpu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, chunk: int,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The same fp32 operations on fixed-shape row tiles, rounded once to x's dtype (as the Triton
    kernel's fp32 accumulator is): per tile, one batched matmul gives every chunk's sum, added in chunk
    order. 16-bit CPU matmuls are also an order of magnitude slower than fp32 ones."""
    M, K = x.shape
    N = w.shape[0]
    chunk = min(chunk, K)
    chunks = -(-K // chunk)
    pad_m, pad_k = (-M) % CPU_BLOCK_M, chunks * chunk - K  # zero rows and zero K tail add exact zeros
    xp = torch.nn.functional.pad(x.float(), (0, pad_k, 0, pad_m))
    wc = torch.nn.functional.pad(w.float(), (0, pad_k)).view(N, chunks, chunk).permute(1, 2, 0)  # [c, chunk, N]
    b = bias.float() if bias is not None else None
    tiles = []
    for i in range(0, xp.shape[0], CPU_BLOCK_M):
        parts = torch.bmm(xp[i:i + CPU_BLOCK_M].view(CPU_BLOCK_M, chunks, chunk).transpose(0, 1), wc)
        total = parts[0]
        for c in range(1, chunks):
            total = total + parts[c]
        if b is not None:
            total = total + b
        tiles.append(total.to(out_dtype or x.dtype))
    return torch.cat(tiles)[:M]


def launch_params(selection: Any) -> dict:
    """The `linear` keyword arguments of a matmul selection (`programs/matmul.py`: the pinned K
    partition `chunk` and the schedule `tile`)."""
    return {"chunk": selection.chunk, "parallel": selection.tile_parallel, "block_m": selection.tile_block_m,
            "block_n": selection.tile_block_n, "block_k": selection.tile_block_k,
            "group_m": selection.tile_group_m, "num_warps": selection.tile_num_warps,
            "num_stages": selection.tile_num_stages, "wgmma": selection.tile_wgmma,
            "swap_ab": selection.tile_swap_ab, "persistent": selection.tile_persistent}


def stock_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The stock arm's linear, what a stock engine runs: cuBLAS on the GPU (its algorithm, and with it
    a row's bits, picked by shape — M included); on the CPU torch's fp32 GEMM on upcast operands,
    rounded once (16-bit CPU GEMMs are ~10x slower, and the fp32 one's blocking follows M too)."""
    if x.is_cuda or x.dtype == torch.float32:
        return torch.nn.functional.linear(x, w, bias)
    return torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float()).to(x.dtype)


def linear_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 reference."""
    out = x.float() @ w.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
