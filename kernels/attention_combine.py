"""The attention's split combine: each (row, head)'s split partials (maximum, sum, fp32 output) folded in split order
j = 0, 1, ... into the row's output and log-sum-exp (`kernels/attention.py` writes the partials). Two kernels do the
same operations in the same order on each element, so they write the same bits (tests/combine_cases.py holds them
to the plain loop's): `_combine_kernel`, one one-warp program a (row, head), and `_combine_heads_kernel`, one program
a row for all its heads. Which one runs is a schedule, chosen by the row count (`COMBINE_HEADS_FROM`)."""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import pdl, pdl_enter, tl, triton
from detent_rl.kernels.launch import launch


@triton.jit
def _combine_kernel(m_ptr, l_ptr, o_ptr, out_ptr, pos_ptr, lse_ptr, stride_mt, stride_mh, stride_ot, stride_oh,
                    stride_os, stride_outt, stride_outh, stride_lh, split_len, HEAD_DIM: tl.constexpr,
                    UNROLL: tl.constexpr, LSE: tl.constexpr, PDL: tl.constexpr, SPLIT: tl.constexpr = 0):
    """Splits j = 0, 1, ... of one (row, head) folded in order. Each trip issues UNROLL splits' loads
    before their arithmetic (a split's loads no longer wait on the previous split's sums); the sums
    still add split j after split j - 1, the same operations as the plain loop (`tests/combine_cases.py`
    holds the two to the same bits). A trip's splits past the row's last re-load that one and leave
    the sums as they were."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    span = split_len
    if SPLIT > 0:  # a pinned split size, compiled in (as the attention kernel's)
        span = SPLIT
    n = tl.load(pos_ptr + t) // span + 1  # the row's position is host-fed (`pdl`): read before the wait
    pdl_enter(PDL)
    d = tl.arange(0, HEAD_DIM)
    ks = tl.arange(0, UNROLL)
    base = t * stride_mt + h * stride_mh
    mx = tl.load(m_ptr + base)
    for j0 in range(0, n, UNROLL):  # the maximum is exact: any order, so whole vectors at a time
        mx = tl.maximum(mx, tl.max(tl.load(m_ptr + base + j0 + ks, mask=j0 + ks < n, other=float("-inf")), 0))
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    o_row = o_ptr + t * stride_ot + h * stride_oh
    for j0 in range(0, n, UNROLL):  # splits in order, the same arithmetic for prefill and decode
        for k in tl.static_range(UNROLL):
            j = tl.minimum(j0 + k, n - 1)
            live = j0 + k < n
            w = tl.exp(tl.load(m_ptr + base + j) - mx)
            total = tl.where(live, total + tl.load(l_ptr + base + j) * w, total)
            acc = tl.where(live, acc + tl.load(o_row + j * stride_os + d) * w, acc)
    tl.store(out_ptr + t * stride_outt + h * stride_outh + d, (acc / total).to(out_ptr.dtype.element_ty))
    if LSE:  # the row's log-sum-exp of its scaled scores, [H, T]: what a FlashAttention backward takes
        tl.store(lse_ptr + h * stride_lh + t + tl.arange(0, 1), mx + tl.log(total))


@triton.jit
def _combine_heads_kernel(m_ptr, l_ptr, o_ptr, out_ptr, pos_ptr, lse_ptr, stride_mt, stride_mh, stride_ot, stride_oh,
                          stride_os, stride_outt, stride_outh, stride_lh, split_len, HEADS, HEAD_DIM: tl.constexpr,
                          HEADS_P2: tl.constexpr, UNROLL: tl.constexpr, LSE: tl.constexpr, PDL: tl.constexpr,
                          SPLIT: tl.constexpr = 0):
    """`_combine_kernel` for every head of one row in one program (heads padded to HEADS_P2, the pad masked):
    each (head, value) element takes the same operations in the same order as there, split after split, so
    the same bits; a prefill of T rows launches T programs instead of T x heads one-warp programs, each of
    which waits on its own chain of loads (the maxima, then the sums)."""
    t = tl.program_id(0)
    span = split_len
    if SPLIT > 0:  # a pinned split size, compiled in (as the attention kernel's)
        span = SPLIT
    n = tl.load(pos_ptr + t) // span + 1  # (before the wait, as `_combine_kernel`'s)
    pdl_enter(PDL)
    d = tl.arange(0, HEAD_DIM)
    h = tl.arange(0, HEADS_P2)
    live_h = h < HEADS
    ks = tl.arange(0, UNROLL)
    base = t * stride_mt + h * stride_mh  # [HEADS_P2]
    mx = tl.load(m_ptr + base, mask=live_h, other=0.0)
    for j0 in range(0, n, UNROLL):  # the maximum is exact: any order
        js = j0 + ks
        mj = tl.load(m_ptr + base[:, None] + js[None, :], mask=live_h[:, None] & (js < n)[None, :],
                     other=float("-inf"))
        mx = tl.maximum(mx, tl.max(mj, 1))
    total = tl.zeros([HEADS_P2], tl.float32)
    acc = tl.zeros([HEADS_P2, HEAD_DIM], tl.float32)
    o_row = o_ptr + t * stride_ot + h[:, None] * stride_oh + d[None, :]
    for j0 in range(0, n, UNROLL):  # splits in order, as `_combine_kernel`
        for k in tl.static_range(UNROLL):
            j = tl.minimum(j0 + k, n - 1)
            live = j0 + k < n
            w = tl.exp(tl.load(m_ptr + base + j, mask=live_h, other=0.0) - mx)
            total = tl.where(live, total + tl.load(l_ptr + base + j, mask=live_h, other=1.0) * w, total)
            acc = tl.where(live, acc + tl.load(o_row + j * stride_os, mask=live_h[:, None], other=0.0) * w[:, None],
                           acc)
    tl.store(out_ptr + t * stride_outt + h[:, None] * stride_outh + d[None, :],
             (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=live_h[:, None])
    if LSE:
        tl.store(lse_ptr + h * stride_lh + t, mx + tl.log(total), mask=live_h)


COMBINE_UNROLL = 4  # splits a combine trip loads at once
COMBINE_WARPS = 1  # a (row, head) is HEAD_DIM values: one warp holds them
# `_combine_heads_kernel`: a row's heads (HEADS_P2 x HEAD_DIM values) on 4 warps, one split a trip, from 256 rows
# (launches of fewer rows take the (row, head) kernel). Schedules (the same bits), set by bench/combine_bench.py's
# per-launch table (H100, µs; docs/BENCHMARKS.md, sessions 47-48): 256 rows x 14 heads x 2 splits 3.76 -> 2.28,
# 2,048 x 14 x 2 18.9 -> 4.46, 8,192 x 14 x 4 71 -> 48; at 64 rows even, at 1-32 rows and at 1-2 rows of 47-48
# splits (long-context decode) slower. One split a trip was at or under two on every shape of 256 rows or more,
# rows of 24 splits among them (256 x 12 x 24: 7.58 against 8.53; session 48)
COMBINE_HEADS_UNROLL = 1
COMBINE_HEADS_WARPS = 4
COMBINE_HEADS_FROM = 256


def _combine_parts(m: torch.Tensor, lsum: torch.Tensor, o: torch.Tensor, out: torch.Tensor, token_pos: torch.Tensor,
                   lse: torch.Tensor | None, split_size: int, fixed: bool) -> tuple[bool, tuple, tuple, dict]:
    """(by row, grid, arguments, constexprs) of the combine: one program a row from `COMBINE_HEADS_FROM` rows.
    `fixed`: the split size compiled in (`paged_attention(fixed_split=)`)."""
    T, H, D = out.shape
    split = split_size if fixed else 0
    args = (m, lsum, o, out, token_pos, lse if lse is not None else m, m.stride(0), m.stride(1), o.stride(0),
            o.stride(1), o.stride(2), out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0, split_size)
    if T >= COMBINE_HEADS_FROM:
        return True, (T,), (*args, H), dict(HEAD_DIM=D, HEADS_P2=triton.next_power_of_2(H), UNROLL=COMBINE_HEADS_UNROLL,
                                            LSE=lse is not None, SPLIT=split, num_warps=COMBINE_HEADS_WARPS)
    return False, (T, H), args, dict(HEAD_DIM=D, UNROLL=COMBINE_UNROLL, LSE=lse is not None, SPLIT=split,
                                     num_warps=COMBINE_WARPS)


def combine_kv_splits(m: torch.Tensor, lsum: torch.Tensor, o: torch.Tensor, out: torch.Tensor,
                      token_pos: torch.Tensor, lse: torch.Tensor | None, split_size: int, fixed: bool = False) -> None:
    """Fold the partials m, lsum [T, H, splits] and o [T, H, splits, D] of rows at positions `token_pos` into
    `out` [T, H, D] (and `lse` [H, T], when given). `fixed`: `split_size` compiled in (a pinned selection's)."""
    by_row, grid, args, consts = _combine_parts(m, lsum, o, out, token_pos, lse, split_size, fixed)
    if by_row:
        launch(_combine_heads_kernel, grid, *args, **consts, **pdl(out))
    else:
        launch(_combine_kernel, grid, *args, **consts, **pdl(out))


def combine_call(m: torch.Tensor, lsum: torch.Tensor, o: torch.Tensor, out: torch.Tensor, token_pos: torch.Tensor,
                 lse: torch.Tensor | None, split_size: int, fixed: bool = False) -> tuple:
    """(kernel, grid, args, kwargs) of the launch `combine_kv_splits` makes for these arguments (to record it)."""
    by_row, grid, args, consts = _combine_parts(m, lsum, o, out, token_pos, lse, split_size, fixed)
    return _combine_heads_kernel if by_row else _combine_kernel, grid, args, dict(consts, **pdl(out))
