"""Seeded, batch-invariant sampling: Gumbel-max with noise keyed by (request seed, position, vocab id).

Noise (`kernels/noise.py`). For a request's seed s (int64), the absolute position p (int64) of the token being sampled
and a vocabulary id i, all in 32-bit unsigned arithmetic (uint32 in Triton, int64 masked to 32 bits
in PyTorch):

    h = MurmurHash3_x86_32(struct.pack("<qqI", s, p, i), seed=0)   # 20 bytes: s, p little-endian
    u = (2 * (h >> 9) + 1) * 2**-24                                  # fp32, exact, in (0, 1)
    g = -log(-log(u))                                                # fp32: a standard Gumbel draw

u keeps 23 random bits, not 24: (h >> 8) * 2**-24 + 2**-25 has no fp32 value above 1/2 (it needs
25 significant bits), rounds pairs of draws together and maps the last one to 1.0, i.e. g = +inf.
No global RNG, row index or batch size enters; the 4 words of (s, p) are mixed once per row.

Selection, per row with temperature T (fp32) and x = logits.float() / T (IEEE division):
- T == 0 (greedy): the argmax of logits.float(), smallest id on ties; top-k, top-p and noise unused.
- T > 0: the argmax over the allowed ids of x + g, smallest id on ties.
- allowed: top-k keeps the k largest logits, ties to the smaller id (exactly k ids; k == 0 or k >= V
  is off). Then top-p: with q = exp(log_softmax(x with the ids top-k dropped set to -inf)) from our
  fixed-block `log_softmax`, the smallest prefix of the ids ordered by (q desc, id asc) whose
  cumulative sum reaches top_p (top_p == 1 is off; every id when the sum never reaches it). The
  sum is a fixed-order scan: within a block of `block` ids an in-block scan, across blocks a
  sequential carry (Triton: `tl.cumsum`; CPU: Hillis-Steele), so it depends on the row alone.

On the GPU the argmax runs over the vocabulary's fixed ranges in parallel CTAs (`kernels/vocab.py`):
each range's best (score, smallest id), then the best over ranges, smallest id on ties — the same
token whatever the ranges, as max and min are exact. `sample_unfiltered` (the decode graph's
sampler) takes the log-softmax partials in the same read of the logits.

Returned logprob: token_logprobs(logits, token, block, num_warps, temperature=T), with T = 1.0 for
greedy rows: the fp32 log_softmax(logits.float() / T)[token], the value the trainer recomputes with
`log_softmax`/`token_logprobs` (bit for bit, same block). It ignores top-k/top-p (no renormalization).
"""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import (FLOAT_DTYPES, INDEX_DTYPES, check_block, dense_rows, pdl, pdl_enter,
                                       require_triton, tl, triton, use_triton)
from detent_rl.kernels.launch import launch
from detent_rl.kernels.log_softmax import log_softmax, token_logprobs
from detent_rl.kernels.noise import MESSAGE_BYTES, fmix32_torch, gumbel, gumbel_noise, mix_word_torch, row_state
from detent_rl.kernels.vocab import vocab_pass

_FILTER_ELEMENTS = 1 << 24  # rows filtered at once x vocab: bounds the sort's [rows, vocab] temporaries


@triton.jit
def _top_p_cutoff_kernel(probs_ptr, top_p_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = probs_ptr + row * n_cols
    top_p = tl.load(top_p_ptr + row)
    lanes = tl.arange(0, BLOCK)
    carry = tl.full([], 0.0, tl.float32)
    first = tl.full([], 0, tl.int32) + n_cols
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        valid = cols < n_cols
        incl = carry + tl.cumsum(tl.load(row_ptr + cols, mask=valid, other=0.0), axis=0)
        first = tl.minimum(first, tl.min(tl.where(valid & (incl >= top_p), cols, n_cols), axis=0))
        carry = tl.sum(tl.where(lanes == BLOCK - 1, incl, 0.0), axis=0)  # one term: exact
    tl.store(out_ptr + row, first.to(tl.int64))


# ---------------------------------------------------------------------------------------------
# top-k / top-p: the allowed ids of the rows that filter

def _keep_first(values: torch.Tensor, sorted_values: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Mask of the first n[r] ids of each row in (value desc, id asc) order.

    `sorted_values` is each row sorted descending. Ids above the n-th value are kept, and of the
    ids equal to it the smallest ones up to the count; the integer cumsum is exact in any order.
    """
    bound = sorted_values.gather(1, (n - 1)[:, None])
    above = values > bound
    tie = values == bound
    quota = n[:, None] - above.sum(1, keepdim=True)
    return above | (tie & (tie.cumsum(1) <= quota))


def _top_p_cutoff_torch(probs_sorted: torch.Tensor, top_p: torch.Tensor, block: int) -> torch.Tensor:
    """First index whose fixed-order inclusive prefix sum reaches top_p (vocab if none): [rows] int64."""
    rows, n = probs_sorted.shape
    first = torch.full((rows,), n, dtype=torch.int64, device=probs_sorted.device)
    carry = torch.zeros(rows, dtype=torch.float32, device=probs_sorted.device)
    for start in range(0, n, block):
        scan = probs_sorted[:, start:start + block]
        step = 1
        while step < scan.shape[1]:  # Hillis-Steele: elementwise adds on fixed lanes
            scan = torch.cat([scan[:, :step], scan[:, step:] + scan[:, :-step]], dim=1)
            step *= 2
        incl = carry[:, None] + scan
        cols = torch.arange(start, start + scan.shape[1], device=probs_sorted.device)
        first = torch.minimum(first, torch.where(incl >= top_p[:, None], cols, n).amin(1))
        carry = incl[:, -1]
    return first


def _top_p_cutoff_triton(probs_sorted: torch.Tensor, top_p: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    require_triton(probs_sorted)
    out = torch.empty(probs_sorted.shape[0], dtype=torch.int64, device=probs_sorted.device)
    launch(_top_p_cutoff_kernel, (probs_sorted.shape[0],), probs_sorted.contiguous(), top_p.contiguous(), out,
           probs_sorted.shape[1], BLOCK=block, num_warps=num_warps, **pdl(out))
    return out


def _filter_rows(logits: torch.Tensor, temps: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor,
                 block: int, num_warps: int, triton_path: bool) -> torch.Tensor:
    """Allowed ids [rows, vocab] bool of rows with T > 0; k == vocab and top_p == 1 mean off."""
    vocab = logits.shape[1]
    scores = logits.float()
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # (logit desc, id asc)
    keep = _keep_first(scores, scores.gather(1, order), k)
    x = (scores / temps[:, None]).masked_fill(~keep, float("-inf"))
    probs = log_softmax(x, block=block, num_warps=num_warps).exp()
    # probs is monotone in the logit, so in `order` it is sorted descending too
    probs_sorted = probs.gather(1, order)
    if triton_path:
        first = _top_p_cutoff_triton(probs_sorted, top_p, block, num_warps)
    else:
        first = _top_p_cutoff_torch(probs_sorted, top_p, block)
    n = torch.where(top_p < 1.0, (first + 1).clamp(max=vocab), vocab)
    return keep & _keep_first(probs, probs_sorted, n)


def _allowed(logits: torch.Tensor, temps: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
             block: int, num_warps: int, triton_path: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(allowed [filtered rows, vocab] uint8, each row's index into it or -1), or None if no row filters."""
    batch, vocab = logits.shape
    k = top_k.long()
    k_on = (k > 0) & (k < vocab)
    rows = ((temps > 0) & (k_on | (top_p < 1.0))).nonzero()[:, 0]
    if rows.numel() == 0:
        return None
    k = torch.where(k_on, k, vocab)
    allowed = torch.empty(rows.numel(), vocab, dtype=torch.uint8, device=logits.device)
    group = max(1, _FILTER_ELEMENTS // vocab)
    for start in range(0, rows.numel(), group):
        r = rows[start:start + group]
        allowed[start:start + r.numel()] = _filter_rows(logits[r], temps[r], k[r], top_p[r], block, num_warps,
                                                        triton_path)
    mask_rows = torch.full((batch,), -1, dtype=torch.int32, device=logits.device)
    mask_rows[rows] = torch.arange(rows.numel(), dtype=torch.int32, device=logits.device)
    return allowed, mask_rows


# ---------------------------------------------------------------------------------------------
# Gumbel-argmax over the vocabulary

def _sample_triton(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temps: torch.Tensor,
                   masks: tuple[torch.Tensor, torch.Tensor] | None, block: int, num_warps: int,
                   temperature: float | None = None) -> dict[str, torch.Tensor]:
    """`vocab_pass`'s tokens (and with `temperature`, their logprobs at it, from the same read)."""
    require_triton(logits)
    allowed, mask_rows = masks if masks is not None else (None, None)
    sampling = (seeds.contiguous(), positions.contiguous(), temps.contiguous(), allowed, mask_rows)
    return vocab_pass(dense_rows(logits), block=block, num_warps=num_warps, temperature=temperature,
                      sampling=sampling)


def _sample_torch(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temps: torch.Tensor,
                  masks: tuple[torch.Tensor, torch.Tensor] | None, block: int) -> torch.Tensor:
    """The kernel's loop on CPU: chunks of `block` ids, a running (best score, smallest id).

    Only elementwise ops and exact max/min: no row's bits depend on how many rows share a chunk.
    """
    batch, vocab = logits.shape
    greedy = (temps == 0)[:, None]
    t = torch.where(greedy[:, 0], 1.0, temps)[:, None]
    state = row_state(seeds, positions)[:, None]
    if masks is not None:
        allowed, mask_rows = masks
        filtered = (mask_rows >= 0)[:, None]
        mask_at = mask_rows.clamp(min=0).long()
    best = torch.full((batch,), float("-inf"), device=logits.device)
    best_id = torch.full((batch,), -1, dtype=torch.int64, device=logits.device)
    for start in range(0, vocab, block):
        ids = torch.arange(start, min(start + block, vocab), device=logits.device)
        x = logits[:, start:start + block].float()
        g = gumbel(fmix32_torch(mix_word_torch(state, ids[None]) ^ MESSAGE_BYTES))
        score = torch.where(greedy, x, x / t + g)
        valid = torch.ones_like(score, dtype=torch.bool)
        if masks is not None:
            valid = ~filtered | (allowed[mask_at, start:start + block] != 0)
        top = torch.where(valid, score, float("-inf")).amax(1)
        first = torch.where(valid & (score == top[:, None]), ids, vocab).amin(1)
        take = (first < vocab) & ((top > best) | (best_id < 0))
        best = torch.where(take, top, best)
        best_id = torch.where(take, first, best_id)
    return best_id


# ---------------------------------------------------------------------------------------------
# public API

def _check_rows(logits: torch.Tensor, specs: dict[str, tuple]) -> None:
    """Each named per-row tensor: [batch], one of its dtypes, on the logits' device."""
    batch = logits.shape[0]
    for name, (t, dtypes) in specs.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a [{batch}] tensor, got {type(t).__name__}"
                            + (": seeded sampling requires a seed per request" if name == "seeds" else ""))
        if t.shape != (batch,) or t.dtype not in dtypes or t.device != logits.device:
            raise ValueError(f"{name} must be [{batch}] {'/'.join(str(d) for d in dtypes)} on {logits.device}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")


def _check(logits: torch.Tensor, seeds: torch.Tensor | None, positions: torch.Tensor | None,
           temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, block: int) -> None:
    if seeds is None:
        raise ValueError("seeded sampling requires a seed per request (seeds is None)")
    if not (isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.dtype in FLOAT_DTYPES):
        raise ValueError("logits must be a [batch, vocab] fp32/bf16/fp16 tensor")
    _check_rows(logits, {"seeds": (seeds, (torch.int64,)), "positions": (positions, (torch.int64,)),
                         "temperature": (temperature, (torch.float32,)), "top_k": (top_k, INDEX_DTYPES),
                         "top_p": (top_p, (torch.float32,))})
    check_block(block)
    bad_t, bad_p, bad_k = torch.stack([~((temperature >= 0) & torch.isfinite(temperature)).all(),
                                       ~((top_p > 0) & (top_p <= 1)).all(), (top_k < 0).any()]).tolist()
    if bad_t:
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature.tolist()}")
    if bad_p:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p.tolist()}")
    if bad_k:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k.tolist()}")


def _sampled_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temps: torch.Tensor, block: int,
                      num_warps: int) -> torch.Tensor:
    """token_logprobs at each row's own temperature (1.0 for greedy), one call per distinct value."""
    temps = torch.where(temps == 0, 1.0, temps)
    values = torch.unique(temps).tolist()
    if len(values) == 1:
        return token_logprobs(logits, tokens, block=block, num_warps=num_warps, temperature=values[0])
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for value in values:
        rows = (temps == value).nonzero()[:, 0]
        out[rows] = token_logprobs(logits[rows], tokens[rows], block=block, num_warps=num_warps, temperature=value)
    return out


def _sample(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temps: torch.Tensor,
            top_k: torch.Tensor, top_p: torch.Tensor, block: int, num_warps: int,
            triton_path: bool) -> tuple[torch.Tensor, torch.Tensor]:
    masks = _allowed(logits, temps, top_k, top_p, block, num_warps, triton_path)
    if triton_path:
        tokens = _sample_triton(logits, seeds, positions, temps, masks, block, num_warps)["tokens"]
    else:
        tokens = _sample_torch(logits, seeds, positions, temps, masks, block)
    return tokens, _sampled_logprobs(logits, tokens, temps, block, num_warps)


def sample(logits: torch.Tensor, seeds: torch.Tensor | None, positions: torch.Tensor, *,
           temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, block: int,
           num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [batch], logprobs fp32 [batch]) for logits [batch, vocab]; see the module docstring.

    seeds/positions int64, temperature/top_p fp32, top_k int32/int64, all [batch]; block and
    num_warps are the `log_softmax` selection's. Each row's result depends on that row alone.
    """
    _check(logits, seeds, positions, temperature, top_k, top_p, block)
    if logits.shape[0] == 0:
        return (torch.empty(0, dtype=torch.int64, device=logits.device),
                torch.empty(0, dtype=torch.float32, device=logits.device))
    return _sample(logits, seeds, positions, temperature, top_k, top_p, block, num_warps, use_triton(logits))


def unfiltered(temperature: float, top_k: int, top_p: float) -> bool:
    """Whether a row with these parameters samples without top-k/top-p filtering (greedy rows never
    filter): `sample_unfiltered` serves it."""
    return temperature == 0 or (top_k == 0 and top_p == 1.0)


def sample_unfiltered(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temps: torch.Tensor, *,
                      temperature: float, block: int, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample` for a batch whose rows all take their logprob at one `temperature` (each row samples at
    `temperature`, or is greedy when `temperature` is 1.0: greedy logprobs are at T = 1) without top-k
    or top-p, with the same bits, and no host synchronisation: it can be captured in a CUDA graph (the
    engine's decode step replays it), since no data-dependent row set or value check runs. The caller
    vouches for the rows (`unfiltered`; temps each 0 or `temperature`, 0 only if it is 1.0); shapes
    are checked here."""
    _check_rows(logits, {"seeds": (seeds, (torch.int64,)), "positions": (positions, (torch.int64,)),
                         "temps": (temps, (torch.float32,))})
    if not (temperature > 0 and temperature != float("inf")):
        raise ValueError(f"temperature must be finite and > 0 (greedy rows use 1.0 for their logprob), "
                         f"got {temperature}")
    check_block(block)
    if use_triton(logits):  # one pass over the vocabulary samples and takes the logprob
        out = _sample_triton(logits, seeds, positions, temps, None, block, num_warps, temperature)
        return out["tokens"], out["logprobs"]
    tokens = _sample_torch(logits, seeds, positions, temps, None, block)
    return tokens, token_logprobs(logits, tokens, block=block, num_warps=num_warps, temperature=temperature)


def sample_ref(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, *, temperature: torch.Tensor,
               top_k: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch, whole rows at once: torch's softmax, cumsum and log_softmax (close, not bitwise)."""
    batch, vocab = logits.shape
    ids = torch.arange(vocab, device=logits.device)
    scores = logits.float()
    greedy = temperature == 0
    t = torch.where(greedy, 1.0, temperature)[:, None]
    x = scores / t
    k = torch.where((top_k > 0) & (top_k < vocab), top_k.long(), vocab)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, ids.expand(batch, vocab))
    keep = rank < k[:, None]
    probs = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=1)
    p_sorted, p_order = torch.sort(probs, dim=1, descending=True, stable=True)
    cum = torch.cumsum(p_sorted, dim=1)
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)  # keep while the mass ahead < top_p
    keep_sorted = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep &= torch.zeros_like(keep).scatter_(1, p_order, keep_sorted)
    perturbed = torch.where(keep, x + gumbel_noise(seeds, positions, ids), float("-inf"))
    tokens = torch.where(greedy, scores.argmax(1), perturbed.argmax(1))
    lp = torch.log_softmax(x, dim=1).gather(1, tokens[:, None])[:, 0]
    return tokens, lp
