"""RMSNorm with an optional fused residual add, batch-invariant given (block, num_warps).

Semantics are HF Llama/Qwen2 RMSNorm:
    h   = x                      (or h = residual + x, rounded to the input dtype; returned too)
    var = sum(h.float() ** 2) / hidden
    out = weight * (h.float() * rsqrt(var + eps)).to(dtype)      (the product in the input dtype)

The sum of squares is the only reduction. Its association is fixed by `block` alone: an fp32
accumulator vector of `block` lanes takes the row chunk by chunk (a masked tail adds exact zeros),
then one reduction folds the vector. `block` comes from the selector (`programs.rows.rmsnorm_program`);
the stock selector changes it with the batch size, which is what changes a row's bits.
"""
from typing import Optional, Union

import torch

from detent_rl.kernels._triton import (FLOAT_DTYPES, aligned, check_block, dense_rows, fold_rows, pdl, pdl_enter,
                                       require_triton, tl, triton, use_triton)
from detent_rl.kernels.launch import launch


@triton.jit
def _rmsnorm_block(x_ptr, res_ptr, res_out_ptr, base, cols, n_cols, HAS_RESIDUAL: tl.constexpr,
                   STORE: tl.constexpr = True):
    """The row's values `h` at `cols`: x, or residual + x rounded to x's dtype (stored to res_out with STORE)."""
    mask = cols < n_cols
    h = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + base + cols, mask=mask, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        if STORE:
            tl.store(res_out_ptr + base + cols, h, mask=mask)
    return h


@triton.jit
def _rmsnorm_store(out_ptr, base, cols, n_cols, h, w, rstd):
    """out = w * (h * rstd rounded to h's dtype), rounded to h's dtype, at `cols`."""
    y = (h.to(tl.float32) * rstd).to(h.dtype)
    tl.store(out_ptr + base + cols, (w.to(tl.float32) * y.to(tl.float32)).to(h.dtype), mask=cols < n_cols)


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, RESIDENT: tl.constexpr = 0):
    pdl_enter(PDL)
    base = tl.program_id(0).to(tl.int64) * n_cols
    if RESIDENT > 0:  # a 16-bit row in 1 or 2 blocks held in registers between the two passes (`resident_blocks`):
        # the loops' operations in their order (and, its squares being exact, their roundings), without the second
        # pass's reloads after the reduction, and the weights loaded before it
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        h0 = _rmsnorm_block(x_ptr, res_ptr, res_out_ptr, base, lanes, n_cols, HAS_RESIDUAL)
        w0 = tl.load(w_ptr + lanes, mask=lanes < n_cols, other=0.0)
        h0f = h0.to(tl.float32)
        acc += h0f * h0f
        if RESIDENT == 2:
            h1 = _rmsnorm_block(x_ptr, res_ptr, res_out_ptr, base, BLOCK + lanes, n_cols, HAS_RESIDUAL)
            w1 = tl.load(w_ptr + BLOCK + lanes, mask=BLOCK + lanes < n_cols, other=0.0)
            h1f = h1.to(tl.float32)
            acc += h1f * h1f
            rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
            _rmsnorm_store(out_ptr, base, BLOCK + lanes, n_cols, h1, w1, rstd)
        else:
            rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        _rmsnorm_store(out_ptr, base, lanes, n_cols, h0, w0, rstd)
    else:
        _rmsnorm_loops(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, base, n_cols, eps, HAS_RESIDUAL, BLOCK)


@triton.jit
def _rmsnorm_loops(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, base, n_cols, eps, HAS_RESIDUAL: tl.constexpr,
                   BLOCK: tl.constexpr):
    """A row of any width: the sum of squares block by block, then a second pass that re-reads the row."""
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        hf = _rmsnorm_block(x_ptr, res_ptr, res_out_ptr, base, start + lanes, n_cols, HAS_RESIDUAL).to(tl.float32)
        acc += hf * hf
    rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        # h is recomputed, not re-read from res_out: same ops, same bits, no intra-program race.
        h = _rmsnorm_block(x_ptr, res_ptr, res_out_ptr, base, cols, n_cols, HAS_RESIDUAL, STORE=False)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0)
        _rmsnorm_store(out_ptr, base, cols, n_cols, h, w, rstd)


RESIDENT_MAX = 2  # the most blocks of a row the forward kernel holds in registers between its passes


def resident_blocks(hidden: int, block: int, itemsize: int) -> int:
    """How many `block`-wide blocks of a `hidden` row of `itemsize`-byte values the forward kernel keeps in registers
    between its two passes (0: the loops re-read the row). Only rows of at most RESIDENT_MAX blocks of 16-bit values
    are held: such a value's square is exact in fp32, so the sum takes the loops' roundings however the compiler
    fuses the squares into the adds. An fp32 square rounds, and the compiler fuses a held row's squares into the
    reduction (sm_90 PTX at 1,024 lanes: 4 FMAs a thread against the loops' 8): the loops' bits were not kept on
    the GPU (session 55), so fp32 rows take the loops (tests/test_kernels_rows*.py). One value a model and dtype,
    so one compiled variant."""
    blocks = -(-hidden // block)
    return blocks if blocks <= RESIDENT_MAX and itemsize <= 2 else 0


def _rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor],
                    block: int, num_warps: int,
                    resident: Optional[int] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """`resident`: the kernel's RESIDENT (default `resident_blocks`; 0 forces the loops, for the tests that compare
    the two paths' bits)."""
    require_triton(x)
    x, weight = dense_rows(x), aligned(weight)
    residual = dense_rows(residual) if residual is not None else None
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else None
    if rows > 0:
        launch(_rmsnorm_kernel, (rows,),
            x, residual if residual is not None else x, weight, out,
            res_out if res_out is not None else out, hidden, float(eps),
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            RESIDENT=resident_blocks(hidden, block, x.element_size()) if resident is None else resident,
            num_warps=num_warps, **pdl(x))
    return out, res_out


def _rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor],
                   block: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    h = x if residual is None else residual + x
    hidden = h.shape[1]

    def square(part: torch.Tensor) -> torch.Tensor:
        p = part.float()
        return p * p

    total = fold_rows(h, block, 0.0, square, torch.add, 0.0)
    rstd = torch.rsqrt(total / hidden + eps)
    y = (h.float() * rstd[:, None]).to(x.dtype)
    return weight * y, (h if residual is not None else None)


@triton.jit
def _rmsnorm_backward_kernel(h_ptr, w_ptr, g_ptr, gh_ptr, dh_ptr, dw_ptr, n_rows, n_cols, eps,
                             HAS_GH: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    dtype = h_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ROWS):
        row = pid * ROWS + i
        mask = cols < tl.where(row < n_rows, n_cols, 0)  # the last program's rows past the end: none
        base = row.to(tl.int64) * n_cols
        h = tl.load(h_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
        n = h * rstd
        dw += g * n.to(dtype).to(tl.float32)
        gn = g * w
        dh = (gn - n * (tl.sum(gn * n, axis=0) / n_cols)) * rstd
        if HAS_GH:
            dh += tl.load(gh_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dh_ptr + base + cols, dh.to(dtype), mask=mask)
    tl.store(dw_ptr + pid.to(tl.int64) * n_cols + cols, dw, mask=cols < n_cols)


BACKWARD_PROGRAMS = 512  # about 4 programs an SM on an H100/H200: rows per program follow the row count


def rmsnorm_backward(h: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, g_h: Optional[torch.Tensor],
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of `rmsnorm` (the trainer's backward; not pinned, only deterministic): given the
    normalised rows h (residual + x where there was a residual), the output's gradient g and the
    gradient reaching h itself (g_h, or None), returns (dh, dweight), in fp32 inside:

        n = h * rstd,  dh = rstd * (g * w - n * mean(g * w * n)) + g_h,  dweight = sum over rows of g * n

    (n rounded to the dtype, as the forward multiplies it by the weight). On the GPU one kernel (each
    program a run of rows, its dweight share written apart) and one sum over the programs' shares."""
    assert h.shape == g.shape and h.dim() == 2 and (g_h is None or g_h.shape == h.shape)
    if use_triton(h):
        return _rmsnorm_backward_triton(h, weight, g, g_h, eps)
    return _rmsnorm_backward_torch(h, weight, g, g_h, eps)


def _rmsnorm_backward_triton(h: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, g_h: Optional[torch.Tensor],
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    require_triton(h)
    h, g = dense_rows(h), dense_rows(g)
    g_h = dense_rows(g_h) if g_h is not None else None
    rows, hidden = h.shape
    block = triton.next_power_of_2(hidden)
    per = max(1, min(32, triton.next_power_of_2(triton.cdiv(rows, BACKWARD_PROGRAMS))))
    programs = triton.cdiv(rows, per)
    dh = torch.empty_like(h)
    dw = torch.empty((programs, hidden), dtype=torch.float32, device=h.device)
    if rows > 0:
        launch(_rmsnorm_backward_kernel, (programs,), h, aligned(weight), g, g_h if g_h is not None else g, dh, dw,
               rows, hidden, float(eps), HAS_GH=g_h is not None, ROWS=per,
               BLOCK=block, num_warps=min(16, max(4, block // 256)), **pdl(h))
    return dh, dw.sum(0).to(weight.dtype)


def _rmsnorm_backward_torch(h: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, g_h: Optional[torch.Tensor],
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    hf = h.float()
    rstd = torch.rsqrt(hf.square().mean(-1, keepdim=True) + eps)
    n = hf * rstd
    gf = g.float()
    gw = (gf * n.to(h.dtype).float()).sum(0).to(weight.dtype)
    gn = gf * weight.float()
    dh = (gn - n * (gn * n).mean(-1, keepdim=True)) * rstd
    if g_h is not None:
        dh += g_h.float()
    return dh.to(h.dtype), gw


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, block: int, num_warps: int = 4,
            residual: Optional[torch.Tensor] = None) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """RMSNorm of each row of x [rows, hidden]; with `residual`, returns (out, residual + x).

    Out of place: inputs are never written. CUDA tensors run the Triton kernel, CPU tensors the
    PyTorch mirror of the same chunked reduction (batch-invariant too; CPU bits != GPU bits).
    """
    assert x.dim() == 2 and x.stride(-1) == 1, "x must be [rows, hidden] with a contiguous last dim"
    assert x.dtype in FLOAT_DTYPES, f"unsupported dtype {x.dtype}"
    assert weight.shape == (x.shape[1],) and weight.dtype == x.dtype and weight.device == x.device, \
        f"weight must be [{x.shape[1]}] {x.dtype} on {x.device}, got {tuple(weight.shape)} {weight.dtype}"
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.device == x.device, \
            "residual must match x in shape, dtype and device"
    check_block(block)
    if use_triton(x):
        out, res = _rmsnorm_triton(x, weight, eps, residual, block, num_warps)
    else:
        out, res = _rmsnorm_torch(x, weight, eps, residual, block)
    return out if residual is None else (out, res)


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
                residual: Optional[torch.Tensor] = None) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """HF Qwen2RMSNorm / LlamaRMSNorm, preceded by the decoder layer's residual add."""
    h = x if residual is None else residual + x
    hf = h.to(torch.float32)
    variance = hf.pow(2).mean(-1, keepdim=True)
    out = weight * (hf * torch.rsqrt(variance + eps)).to(x.dtype)
    return out if residual is None else (out, h)
