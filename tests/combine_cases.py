"""The attention combine's unrolled loops, one program a (row, head) or a row's heads in one, against the plain
loop they replaced: the same output and log-sum-exp bits for rows of 1-9 splits (a trip of `COMBINE_UNROLL` or
`COMBINE_HEADS_UNROLL` splits, and its remainder; 3 and 14 heads, padded to 4 and 16 in the one-program-a-row kernel).
Used by the interpreted test (logic) and the GPU test (bits); the control gives the plain loop each row's
splits in reverse order, which the same comparison must see."""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import pdl_enter, tl, triton
from detent_rl.kernels.attention_combine import (COMBINE_HEADS_UNROLL, COMBINE_HEADS_WARPS, COMBINE_UNROLL,
                                                 COMBINE_WARPS, _combine_heads_kernel, _combine_kernel)


@triton.jit
def ordered_combine(m_ptr, l_ptr, o_ptr, out_ptr, pos_ptr, lse_ptr, stride_mt, stride_mh, stride_ot, stride_oh,
                    stride_os, stride_outt, stride_outh, stride_lh, split_len, HEAD_DIM: tl.constexpr,
                    UNROLL: tl.constexpr, LSE: tl.constexpr, PDL: tl.constexpr):
    """The combine as it was: one split's loads, then its sums, split after split. It takes `_combine_kernel`'s
    arguments (UNROLL unused), so it can stand in for it (`bench/combine_bench.py --engine plain`)."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(pos_ptr + t) // split_len + 1
    d = tl.arange(0, HEAD_DIM)
    base = t * stride_mt + h * stride_mh
    mx = tl.load(m_ptr + base)
    for j in range(1, n):
        mx = tl.maximum(mx, tl.load(m_ptr + base + j))
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for j in range(0, n):
        w = tl.exp(tl.load(m_ptr + base + j) - mx)
        total += tl.load(l_ptr + base + j) * w
        acc += tl.load(o_ptr + t * stride_ot + h * stride_oh + j * stride_os + d) * w
    tl.store(out_ptr + t * stride_outt + h * stride_outh + d, (acc / total).to(out_ptr.dtype.element_ty))
    if LSE:
        tl.store(lse_ptr + h * stride_lh + t + tl.arange(0, 1), mx + tl.log(total))


def _partials(device: str, rows: int, heads: int, splits: int, dim: int, split_len: int, seed: int):
    """Random split partials as the attention kernel writes them: maxima over a wide range (so the
    weights exp(m_j - max) span many binades), positive sums, fp32 outputs; row t has t % 9 + 1 splits."""
    g = torch.Generator().manual_seed(seed)
    m = (torch.randn(rows, heads, splits, generator=g) * 6).to(device)
    lsum = (torch.rand(rows, heads, splits, generator=g) * 50 + 0.5).to(device)
    o = (torch.randn(rows, heads, splits, dim, generator=g) * 20).to(device)
    pos = torch.tensor([(t % splits) * split_len + (t * 7) % split_len for t in range(rows)], dtype=torch.int32,
                       device=device)
    return m, lsum, o, pos


def _reversed(pos: torch.Tensor, split_len: int, *partials: torch.Tensor) -> list[torch.Tensor]:
    """Each row's splits in reverse order (its first n, the rest as they were): the plain loop then folds the
    same splits last to first."""
    splits = partials[0].shape[2]
    n = (pos.long() // split_len + 1)[:, None]
    j = torch.arange(splits, device=pos.device)[None, :]
    order = torch.where(j < n, n - 1 - j, j)  # [rows, splits]
    out = []
    for x in partials:
        idx = order[:, None, :].expand(x.shape[0], x.shape[1], splits)
        out.append(torch.gather(x, 2, idx if x.dim() == 3 else idx[..., None].expand(x.shape)))
    return out


def combine_both(device: str, dtype: torch.dtype, reverse: bool = False, seed: int = 0, kernel: str = "unrolled",
                 heads: int = 3):
    """(`kernel`'s, the plain loop's) outputs and log-sum-exps of the same partials; `kernel`: "unrolled"
    (`_combine_kernel`) or "heads" (`_combine_heads_kernel`). reverse: the plain loop's splits in reverse order
    (the control)."""
    rows, splits, dim, split_len = 45, 9, 64, 256
    m, lsum, o, pos = _partials(device, rows, heads, splits, dim, split_len, seed)
    got = []
    for which in (kernel, "plain"):
        if which == "plain" and reverse:
            m, lsum, o = _reversed(pos, split_len, m, lsum, o)
        out = torch.empty(rows, heads, dim, dtype=dtype, device=device)
        lse = torch.empty(heads, rows, dtype=torch.float32, device=device)
        args = (m, lsum, o, out, pos, lse, m.stride(0), m.stride(1), o.stride(0), o.stride(1), o.stride(2),
                out.stride(0), out.stride(1), lse.stride(0), split_len)
        if which == "unrolled":
            _combine_kernel[(rows, heads)](*args, HEAD_DIM=dim, UNROLL=COMBINE_UNROLL, LSE=True, PDL=False,
                                           num_warps=COMBINE_WARPS)
        elif which == "heads":
            _combine_heads_kernel[(rows,)](*args, heads, HEAD_DIM=dim, HEADS_P2=triton.next_power_of_2(heads),
                                           UNROLL=COMBINE_HEADS_UNROLL, LSE=True, PDL=False,
                                           num_warps=COMBINE_HEADS_WARPS)
        else:
            ordered_combine[(rows, heads)](*args, HEAD_DIM=dim, UNROLL=1, LSE=True, PDL=False)
        got.append((out, lse))
    return got


def check_combine(device: str, dtype: torch.dtype) -> list[str]:
    """What differs between each combine kernel and the plain loop (nothing, if the bits hold), and, as the
    control, whether the splits folded in reverse are seen (a list entry when they are NOT)."""
    bad = []
    for kernel, heads in (("unrolled", 3), ("heads", 3), ("heads", 14)):
        for seed in (0, 1):
            (out, lse), (ref, ref_lse) = combine_both(device, dtype, seed=seed, kernel=kernel, heads=heads)
            if not torch.equal(out, ref):
                bad.append(f"{kernel}, {heads} heads, {dtype}, seed {seed}: {int((out != ref).sum())} outputs differ")
            if not torch.equal(lse, ref_lse):
                bad.append(f"{kernel}, {heads} heads, {dtype}, seed {seed}: {int((lse != ref_lse).sum())} "
                           f"log-sum-exps differ")
        (out, lse), (rev, rev_lse) = combine_both(device, dtype, reverse=True, kernel=kernel, heads=heads)
        if torch.equal(out, rev) and torch.equal(lse, rev_lse):
            bad.append(f"{kernel}, {heads} heads, {dtype}: control: the splits folded in reverse were not seen")
    return bad
