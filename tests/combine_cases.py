"""The attention combine's unrolled loops against the plain loop they replaced: the same output and
log-sum-exp bits for rows of 1-9 splits (a trip of `COMBINE_UNROLL` splits, and its remainder).
Used by the interpreted test (logic) and the GPU test (bits); the control gives the plain loop each row's
splits in reverse order, which the same comparison must see."""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import pdl_enter, tl, triton
from detent_rl.kernels.attention import COMBINE_UNROLL, COMBINE_WARPS, _combine_kernel


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


def combine_both(device: str, dtype: torch.dtype, reverse: bool = False, seed: int = 0):
    """(unrolled, plain) outputs and log-sum-exps of the same partials (reverse: the plain loop's splits in
    reverse order, the control)."""
    rows, heads, splits, dim, split_len = 45, 3, 9, 64, 256
    m, lsum, o, pos = _partials(device, rows, heads, splits, dim, split_len, seed)
    got = []
    for kernel in ("unrolled", "plain"):
        if kernel == "plain" and reverse:
            m, lsum, o = _reversed(pos, split_len, m, lsum, o)
        out = torch.empty(rows, heads, dim, dtype=dtype, device=device)
        lse = torch.empty(heads, rows, dtype=torch.float32, device=device)
        args = (m, lsum, o, out, pos, lse, m.stride(0), m.stride(1), o.stride(0), o.stride(1), o.stride(2),
                out.stride(0), out.stride(1), lse.stride(0), split_len)
        if kernel == "unrolled":
            _combine_kernel[(rows, heads)](*args, HEAD_DIM=dim, UNROLL=COMBINE_UNROLL, LSE=True, PDL=False,
                                           num_warps=COMBINE_WARPS)
        else:
            ordered_combine[(rows, heads)](*args, HEAD_DIM=dim, UNROLL=1, LSE=True, PDL=False)
        got.append((out, lse))
    return got


def check_combine(device: str, dtype: torch.dtype) -> list[str]:
    """What differs between the unrolled and the plain combine (nothing, if the bits hold), and, as the
    control, whether the splits folded in reverse are seen (a list entry when they are NOT)."""
    bad = []
    for seed in (0, 1):
        (out, lse), (ref, ref_lse) = combine_both(device, dtype, seed=seed)
        if not torch.equal(out, ref):
            bad.append(f"{dtype}, seed {seed}: {int((out != ref).sum())} output values differ")
        if not torch.equal(lse, ref_lse):
            bad.append(f"{dtype}, seed {seed}: {int((lse != ref_lse).sum())} log-sum-exps differ")
    (out, lse), (rev, rev_lse) = combine_both(device, dtype, reverse=True)
    if torch.equal(out, rev) and torch.equal(lse, rev_lse):
        bad.append(f"{dtype}: control: the splits folded in reverse were not seen")
    return bad
