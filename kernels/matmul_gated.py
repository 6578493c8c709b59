"""The gated MLP's gate/up projection with SiLU-and-mul in its epilogue: `silu(x @ w_gate.T) * (x @ w_up.T)` in one
launch, where the two kernels `linear` + `silu_and_mul` take two and write, then read back, the [M, 2d] projection.

Its bits are theirs. Each output tile holds the same columns j of the gate and the up projection (w's rows j and
d + j), each summed over the pinned K partition by the same `tl.dot`s as `linear`'s sequential form sums them
(chunks from fresh fp32 accumulators, added in chunk order, the bias, one rounding to the model dtype); the
epilogue then runs `silu_and_mul`'s arithmetic on those rounded values (`s = (g / (1 + exp(-g)))` rounded, times
`u`, rounded). A tile's width is bit-neutral (`matmul.py`), so the tile is the selection's with half its columns
(two accumulators of half the width: the same registers and the same number of programs as `linear`'s tile).

Where it runs: `MLP.forward` without a gradient (the rollout's steps, the trainer's rescore), in the pinned arms,
when `DETENT_GATED_MLP=1` (off by default until the H200 has timed it) and the selection's schedule is one this
kernel computes: the Triton tile (not the warpgroup kernel's) in the sequential form or over one chunk (the
parallel form's chunk sums need the combine kernel, which rounds only after the sum). Otherwise, and with a
gradient (the trainer's update keeps the projection for its backward), the two kernels run. On the CPU outside
the interpreter it is the two functions composed.
"""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import env, interpreting, pdl, pdl_enter, tl, triton
from detent_rl.kernels.launch import launch
from detent_rl.kernels.matmul import _tile_offsets, linear, linear_ref
from detent_rl.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref


def enabled() -> bool:
    """`DETENT_GATED_MLP=1`, read at every call (and graph capture)."""
    return env("DETENT_GATED_MLP", "0") == "1"


@triton.jit
def _dot2_k_blocks(x_ptr, w_ptr, up_ptr, gate, up, offs_m, offs_n, k_start, num_blocks, M, N, K, stride_xm,
                   stride_xk, stride_wn, stride_wk, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """`matmul._dot_k_blocks` of the gate's and the up projection's columns at once: x's block loaded once, each
    accumulator taking the same `tl.dot`s in the same block order as `linear`'s."""
    for kb in range(0, num_blocks):
        offs_k = k_start + kb * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w_mask = (offs_n[None, :] < N) & (offs_k[:, None] < K)
        w_offs = offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
        wg = tl.load(w_ptr + w_offs, mask=w_mask, other=0.0)
        wu = tl.load(up_ptr + w_offs, mask=w_mask, other=0.0)
        if UPCAST:  # the CPU interpreter mis-computes tl.dot on 16-bit operands
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        if IEEE:
            gate = tl.dot(x, wg, gate, input_precision="ieee")
            up = tl.dot(x, wu, up, input_precision="ieee")
        else:
            gate = tl.dot(x, wg, gate)
            up = tl.dot(x, wu, up)
    return gate, up


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, D, K, num_chunks, stride_xm, stride_xk, stride_wn,
                         stride_wk, stride_om, stride_on, HAS_BIAS: tl.constexpr, CHUNK: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         IEEE: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    offs_m, offs_n = _tile_offsets(tl.program_id(0), M, D, BLOCK_M, BLOCK_N, GROUP_M)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < D)
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # each chunk starts fresh accumulators
    up_ptr = w_ptr + D * stride_wn  # w's rows d + j: the up projection's column j
    gate, up = _dot2_k_blocks(x_ptr, w_ptr, up_ptr, zero, zero, offs_m, offs_n, 0, CHUNK // BLOCK_K, M, D, K,
                              stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
    for c in range(1, num_chunks):  # chunk sums added in chunk order, as `linear`'s sequential form adds them
        g, u = _dot2_k_blocks(x_ptr, w_ptr, up_ptr, zero, zero, offs_m, offs_n, c * CHUNK, CHUNK // BLOCK_K, M, D,
                              K, stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, IEEE, UPCAST)
        gate += g
        up += u
    if HAS_BIAS:
        gate += tl.load(b_ptr + offs_n, mask=offs_n < D, other=0.0).to(tl.float32)[None, :]
        up += tl.load(b_ptr + D + offs_n, mask=offs_n < D, other=0.0).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)  # the projection's rounding, then silu_and_mul's arithmetic
    s = (g / (1.0 + tl.exp(-g))).to(dtype)
    y = (s.to(tl.float32) * up.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, y, mask=mask)


FUSED_MIN_BLOCK_N = 64  # the selection's tile width from which the one launch is taken (half of it: 32 columns)


def fusable(launch_params: dict, k: int) -> bool:
    """Whether a gate/up selection's schedule (`matmul.launch_params`) is one `gate_up_silu` computes: the
    Triton tile (not the warpgroup kernel), sequential or over one chunk, at least FUSED_MIN_BLOCK_N wide. (On the
    H200, the 0.5B gate/up: the 16 x 64 tile's one launch took 7.8 µs at M = 1-8 against the two launches' 9.1-9.5;
    the 16 x 32 tile's, 16 columns a program, 9.7-13.5 against 8.9-12.0: docs/BENCHMARKS.md, session 35.)"""
    one_chunk = launch_params["chunk"] >= -(-k // launch_params["block_k"]) * launch_params["block_k"]
    return (not launch_params["wgmma"] and (not launch_params["parallel"] or one_chunk)
            and launch_params["block_n"] >= FUSED_MIN_BLOCK_N)


def gate_up_silu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, *, block: int, **launch_params
                 ) -> torch.Tensor:
    """`silu_and_mul(linear(x, w, bias, **launch_params), block=block)` for x [M, K], w [2d, K] (gate rows, then
    up rows), bias [2d] or None: [M, d], the same bits, in one launch where the schedule is `fusable`."""
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1] and w.shape[0] % 2 == 0, \
        f"gate_up_silu expects x [M, K] and w [2d, K], got {tuple(x.shape)}, {tuple(w.shape)}"
    assert x.dtype == w.dtype and (bias is None or (bias.shape == (w.shape[0],) and bias.dtype == w.dtype))
    if not (x.is_cuda or interpreting()) or not fusable(launch_params, x.shape[1]):
        return silu_and_mul(linear(x, w, bias, **launch_params), block=block)
    M, K = x.shape
    D = w.shape[0] // 2
    chunk, block_k = launch_params["chunk"], launch_params["block_k"]
    assert chunk % block_k == 0, f"chunk {chunk} must be whole BLOCK_K {block_k} blocks"
    chunk = min(chunk, -(-K // block_k) * block_k)  # as `linear`: past K a chunk only adds exact zeros
    if not launch_params["parallel"] and block_k == chunk:  # as `linear`: two blocks a chunk keep its own sum
        block_k //= 2
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    block_m, block_n = launch_params["block_m"], launch_params["block_n"] // 2
    tiles = triton.cdiv(M, block_m) * triton.cdiv(D, block_n)
    launch(_gate_up_silu_kernel, (tiles,), x, w, bias if bias is not None else out, out, M, D, K,
           triton.cdiv(K, chunk), x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0), out.stride(1),
           HAS_BIAS=bias is not None, CHUNK=chunk, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
           GROUP_M=launch_params.get("group_m", 8), IEEE=x.dtype == torch.float32,
           UPCAST=interpreting() and x.dtype != torch.float32, num_warps=launch_params.get("num_warps", 4),
           num_stages=launch_params.get("num_stages", 3), **pdl(x))
    return out


def gate_up_silu_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """HF's `act_fn(gate_proj(x)) * up_proj(x)` through the fp32 references (`linear_ref`, `silu_and_mul_ref`)."""
    return silu_and_mul_ref(linear_ref(x, w, bias))
