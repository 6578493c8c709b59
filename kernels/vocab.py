"""One pass over the vocabulary, split into fixed ranges: the reduction under log-softmax and sampling.

A row of V logits is cut into `n = ceil(V / split)` ranges of `split` ids (`vocab_split`: a multiple
of `block`, a function of (V, block) alone, at most MAX_SPLITS ranges). Each range r gives partials

    m_r = max(x[range])                                  (exact)
    s_r = sum(exp(x[range] - m_r))                       (`block` fp32 lanes, chunk by chunk, then folded;
                                                          0 for a range of -inf alone, e.g. top-k's mask)
    best_r, id_r = max(x[range] / t + g), its smallest id   (sampling: `sampling`'s score; exact)

and one combine per row folds them:

    M = max_r m_r,   S = sum_r s_r * exp(m_r - M),   lse = log(S)
    token = the smallest id whose score equals max_r best_r

With one range (V <= split) this is the whole-row formula exactly: S = s_0 * exp(0) = s_0. Every
step depends on the row, `block`, `num_warps` (the fold's tree) and the split alone — never on the
row count — and on the GPU the ranges run in parallel CTAs, so a one-row decode step reads its
151,936 logits with ~50 CTAs instead of one. The combine is one kernel for every caller (the
sampled token's logprob, `token_logprobs`, `log_softmax`), with a fixed NS-lane vector and one
warp, so its fold is the same tree wherever S is needed. The CPU mirror folds the same ranges with
`fold_rows` and sums S range by range in order (its bits are the CPU's own, as everywhere).
"""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import fold_rows, pdl, pdl_enter, tl, triton
from detent_rl.kernels.launch import launch
from detent_rl.kernels.noise import fmix32, mix_word

MAX_SPLITS = 64


def vocab_split(vocab: int, block: int) -> int:
    """Ids per range: the fewest blocks per range that keep the ranges at most MAX_SPLITS."""
    chunks = -(-vocab // block)
    return block * -(-chunks // MAX_SPLITS)


def num_splits(vocab: int, block: int) -> int:
    return -(-vocab // vocab_split(vocab, block))


def _lanes(n: int) -> int:
    """The combine's vector width: the next power of two >= n (and >= 16)."""
    return max(16, 1 << (n - 1).bit_length())


@triton.jit
def _partials_kernel(x_ptr, n_cols, temperature, seeds_ptr, positions_ptr, temps_ptr, allowed_ptr, mask_rows_ptr,
                     part_m_ptr, part_s_ptr, part_best_ptr, part_id_ptr, n_splits,
                     SPLIT: tl.constexpr, NS: tl.constexpr, LSE: tl.constexpr, SAMPLE: tl.constexpr,
                     HAS_MASK: tl.constexpr, APPLY_TEMP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1)
    out = row * NS + r
    if r >= n_splits:  # padding lanes of the combine's vector: identities
        if LSE:
            tl.store(part_m_ptr + out, float("-inf"))
            tl.store(part_s_ptr + out, 0.0)
        if SAMPLE:
            tl.store(part_best_ptr + out, float("-inf"))
            tl.store(part_id_ptr + out, -1)
        return
    row_ptr = x_ptr + row * n_cols
    start = r * SPLIT
    end = tl.minimum(start + SPLIT, n_cols)
    lanes = tl.arange(0, BLOCK)
    if SAMPLE:
        t = tl.load(temps_ptr + row)
        greedy = t == 0.0
        unit = t == 1.0
        seed = tl.load(seeds_ptr + row)
        pos = tl.load(positions_ptr + row)
        state = mix_word(tl.full([], 0, tl.uint32), seed.to(tl.uint32))
        state = mix_word(state, (seed >> 32).to(tl.uint32))
        state = mix_word(state, pos.to(tl.uint32))
        state = mix_word(state, (pos >> 32).to(tl.uint32))
        if HAS_MASK:
            mask_row = tl.load(mask_rows_ptr + row).to(tl.int64)
            mask_ptr = allowed_ptr + tl.maximum(mask_row, 0) * n_cols
            mask_end = tl.where(mask_row >= 0, end, 0)  # an unfiltered row reads no mask
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_id = tl.full([BLOCK], -1, tl.int32)
    acc_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for c in range(start, end, BLOCK):
        cols = c + lanes
        inside = cols < end
        raw = tl.load(row_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32)
        if LSE:
            x = raw
            if APPLY_TEMP:
                x = tl.math.div_rn(raw, temperature)
            acc_max = tl.maximum(acc_max, x)
        if SAMPLE:
            valid = inside
            if HAS_MASK:
                valid = valid & (tl.load(mask_ptr + cols, mask=cols < mask_end, other=1) != 0)
            # Branches on the row's temperature (uniform in the program) skip work whose result is known:
            # a greedy row's score is its logit, so it draws no noise; at T = 1, x / T is x, bit for bit.
            if greedy:
                score = raw
            else:
                h = fmix32(mix_word(state, cols.to(tl.uint32)) ^ 20)
                u = (((h >> 9) << 1) | 1).to(tl.float32) * 5.9604644775390625e-08
                g = -tl.log(-tl.log(u))
                if unit:
                    score = raw + g
                else:
                    score = tl.math.div_rn(raw, t) + g
            # a lane keeps its first (smallest) id among equal scores; ids only grow along the loop
            take = valid & ((score > best) | (best_id < 0))
            best = tl.where(take, score, best)
            best_id = tl.where(take, cols, best_id)
    if SAMPLE:
        top = tl.max(best, axis=0)
        winner = tl.min(tl.where((best == top) & (best_id >= 0), best_id, n_cols), axis=0)
        tl.store(part_best_ptr + out, top)
        tl.store(part_id_ptr + out, tl.where(winner < n_cols, winner, -1))
    if LSE:
        m = tl.max(acc_max, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)  # a range masked whole (top-k's -inf) sums to 0
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(start, end, BLOCK):
            cols = c + lanes
            x = tl.load(row_ptr + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
            if APPLY_TEMP:
                x = tl.math.div_rn(x, temperature)
            acc += tl.exp(x - shift)  # masked lanes: exp(-inf) adds an exact zero
        tl.store(part_m_ptr + out, m)
        tl.store(part_s_ptr + out, tl.sum(acc, axis=0))


@triton.jit
def _combine_kernel(x_ptr, n_cols, temperature, ids_ptr, part_m_ptr, part_s_ptr, part_best_ptr, part_id_ptr,
                    out_ids_ptr, out_lp_ptr, out_m_ptr, out_lse_ptr, NS: tl.constexpr, SAMPLE: tl.constexpr,
                    TOKEN_LP: tl.constexpr, STATS: tl.constexpr, APPLY_TEMP: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    lanes = row * NS + tl.arange(0, NS)
    if SAMPLE:
        best = tl.load(part_best_ptr + lanes)
        ids = tl.load(part_id_ptr + lanes)
        top = tl.max(best, axis=0)
        token = tl.min(tl.where((best == top) & (ids >= 0), ids, n_cols), axis=0).to(tl.int64)
        tl.store(out_ids_ptr + row, token)
    if TOKEN_LP or STATS:
        m = tl.load(part_m_ptr + lanes)
        big = tl.max(m, axis=0)
        lse = tl.log(tl.sum(tl.load(part_s_ptr + lanes) * tl.exp(m - big), axis=0))
        if STATS:
            tl.store(out_m_ptr + row, big)
            tl.store(out_lse_ptr + row, lse)
        if TOKEN_LP:
            if not SAMPLE:
                token = tl.load(ids_ptr + row).to(tl.int64)
            x = tl.load(x_ptr + row * n_cols + token).to(tl.float32)
            if APPLY_TEMP:
                x = tl.math.div_rn(x, temperature)
            tl.store(out_lp_ptr + row, (x - big) - lse)


@triton.jit
def _write_kernel(x_ptr, out_ptr, m_ptr, lse_ptr, n_cols, temperature, SPLIT: tl.constexpr,
                  APPLY_TEMP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """log_softmax's output, range by range: (x - M) - lse."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * SPLIT
    end = tl.minimum(start + SPLIT, n_cols)
    big = tl.load(m_ptr + row)
    lse = tl.load(lse_ptr + row)
    for c in range(start, end, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        mask = cols < end
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if APPLY_TEMP:
            x = tl.math.div_rn(x, temperature)
        tl.store(out_ptr + row * n_cols + cols, (x - big) - lse, mask=mask)


def vocab_pass(logits: torch.Tensor, *, block: int, num_warps: int, temperature: float | None = None,
               token_ids: torch.Tensor | None = None, sampling: tuple | None = None, stats: bool = False,
               ) -> dict[str, torch.Tensor]:
    """The Triton pass over dense logits [rows, V] (a 16-byte-aligned base): what the flags ask for.

    `temperature`: the log-softmax temperature (None: no log-softmax partials). `sampling`: (seeds,
    positions, temps, allowed, mask_rows) to sample each row (`allowed`/`mask_rows` None: unfiltered);
    its token's logprob follows when `temperature` is set. `token_ids`: the ids whose logprob to take
    (without sampling). `stats`: return each row's (M, lse) for `log_softmax`'s output. Returns
    {"tokens", "logprobs", "m", "lse"} as asked."""
    rows, vocab = logits.shape
    dev = logits.device
    split, n = vocab_split(vocab, block), num_splits(vocab, block)
    ns = _lanes(n)
    lse = temperature is not None
    f32 = lambda: torch.empty(rows * ns, dtype=torch.float32, device=dev)  # noqa: E731
    part_m, part_s = (f32(), f32()) if lse else (logits, logits)  # placeholders are never read
    part_best = f32() if sampling is not None else logits
    part_id = torch.empty(rows * ns, dtype=torch.int32, device=dev) if sampling is not None else logits
    seeds, positions, temps, allowed, mask_rows = sampling if sampling is not None else (logits,) * 5
    has_mask = allowed is not None
    if not has_mask:
        allowed = mask_rows = logits
    t = float(temperature) if lse else 1.0
    apply_temp = lse and t != 1.0
    out: dict[str, torch.Tensor] = {}
    if rows == 0:
        return out
    launch(_partials_kernel, (rows, ns), logits, vocab, t, seeds, positions, temps, allowed, mask_rows,
           part_m, part_s, part_best, part_id, n, SPLIT=split, NS=ns, LSE=lse,
           SAMPLE=sampling is not None, HAS_MASK=has_mask, APPLY_TEMP=apply_temp,
           BLOCK=block, num_warps=num_warps, **pdl(logits))
    token_lp = lse and (sampling is not None or token_ids is not None)
    tokens = torch.empty(rows, dtype=torch.int64, device=dev) if sampling is not None else None
    lp = torch.empty(rows, dtype=torch.float32, device=dev) if token_lp else None
    m = torch.empty(rows, dtype=torch.float32, device=dev) if stats else None
    lse_out = torch.empty(rows, dtype=torch.float32, device=dev) if stats else None
    ph = logits  # placeholder for unused pointers
    launch(_combine_kernel, (rows,), logits, vocab, t, token_ids if token_ids is not None else ph, part_m, part_s,
           part_best, part_id, tokens if tokens is not None else ph, lp if lp is not None else ph,
           m if stats else ph, lse_out if stats else ph, NS=ns, SAMPLE=sampling is not None,
           TOKEN_LP=token_lp, STATS=stats, APPLY_TEMP=apply_temp, num_warps=1, **pdl(logits))
    for key, value in (("tokens", tokens), ("logprobs", lp), ("m", m), ("lse", lse_out)):
        if value is not None:
            out[key] = value
    return out


def write_log_softmax(logits: torch.Tensor, m: torch.Tensor, lse: torch.Tensor, *, block: int, num_warps: int,
                      temperature: float) -> torch.Tensor:
    rows, vocab = logits.shape
    out = torch.empty((rows, vocab), dtype=torch.float32, device=logits.device)
    split = vocab_split(vocab, block)
    if rows > 0:
        launch(_write_kernel, (rows, num_splits(vocab, block)), logits, out, m, lse, vocab, float(temperature),
               SPLIT=split, APPLY_TEMP=temperature != 1.0, BLOCK=block, num_warps=num_warps, **pdl(logits))
    return out


def max_logsumexp_torch(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU mirror on scaled fp32 logits x [rows, V]: each row's (M, lse), range by range."""
    split = vocab_split(x.shape[1], block)
    ms, ss = [], []
    for start in range(0, x.shape[1], split):
        part = x[:, start:start + split]
        m = fold_rows(part, block, float("-inf"), lambda p: p, torch.maximum, float("-inf"))
        shift = torch.where(m == float("-inf"), 0.0, m)[:, None]  # a range masked whole sums to 0
        ss.append(fold_rows(part, block, float("-inf"), lambda p, shift=shift: torch.exp(p - shift), torch.add, 0.0))
        ms.append(m)
    big = ms[0]
    for m in ms[1:]:
        big = torch.maximum(big, m)
    total = torch.zeros_like(big)
    for m, s in zip(ms, ss):
        total = total + s * torch.exp(m - big)
    return big, torch.log(total)
