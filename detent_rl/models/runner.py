"""A minimal step runner for tests and tools: builds the ForwardContext of a step and runs the model.

A step is a list of spans, one per sequence: new tokens that follow `cached` tokens already in
that sequence's pages. Prefill (cached = 0), chunked prefill, decode (one token) and the trainer's
one-shot prefill are all spans. Pages here are handed out contiguously per sequence; the engine's
block manager (prefix sharing, eviction) replaces that, not this context building.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from detent_rl.kernels.attention import attn_meta, device_tensor
from detent_rl.kernels.autograd import token_logprobs_segments_autograd
from detent_rl.models.context import ForwardContext, KVCache, SGLangRows, set_context
from detent_rl.models.model import CausalLM


@dataclass(frozen=True)
class Span:
    tokens: list[int]
    cached: int  # tokens of this sequence already in its pages; the first new one sits at this position
    pages: list[int]  # the sequence's page ids, covering at least cached + len(tokens) positions


def check_spans(model: CausalLM, spans: list[Span]) -> None:
    """Refuse a step that has no span, a span without tokens, or one whose positions its pages or the rope table
    do not cover."""
    if not spans or any(not s.tokens for s in spans):
        raise ValueError("a step needs at least one span, and every span at least one token")
    page = model.page_size
    for i, s in enumerate(spans):
        end = s.cached + len(s.tokens)
        if end > len(s.pages) * page:
            raise ValueError(f"span {i}: {end} positions do not fit its {len(s.pages)} pages of {page}")
        if end > model.max_positions:
            raise ValueError(f"span {i}: position {end - 1} is past the rope table ({model.max_positions})")


def step_inputs(model: CausalLM, caches: list[KVCache], spans: list[Span]
                ) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
    """(input_ids [T], positions [T], context) of one step over `spans`, on the model's device."""
    check_spans(model, spans)
    page, device = model.page_size, model.device
    ids = [t for s in spans for t in s.tokens]
    # the page table in one host tensor, and every token's cache slot from it in a few tensor ops: a
    # prefill of 256 sequences made 256 small tensors and 8,192 slots one at a time (~5 ms of host)
    width = max(len(s.pages) for s in spans)
    table = torch.tensor([list(s.pages) + [0] * (width - len(s.pages)) for s in spans], dtype=torch.int32)
    q_lens, cached = [len(s.tokens) for s in spans], [s.cached for s in spans]
    lens = torch.tensor(q_lens)
    row = torch.repeat_interleave(torch.arange(len(spans)), lens)
    pos = torch.arange(len(ids)) + torch.repeat_interleave(torch.tensor(cached) - (torch.cumsum(lens, 0) - lens), lens)
    slots = table[row, pos // page].long() * page + pos % page
    max_k = max(c + n for c, n in zip(cached, q_lens))
    sel = model.select_attention(len(spans), max(q_lens), len(ids), max_k)
    meta = attn_meta(q_lens, cached, table, *model.attention_tiling(sel), device=device)  # (one copy)
    # the token ids and their slots in one copy, each 16-byte aligned
    both = torch.cat([torch.tensor(ids + [0] * (len(ids) % 2), dtype=torch.int64), slots])
    both = both.to(device, non_blocking=True)
    at = len(ids) + len(ids) % 2
    ctx = ForwardContext(meta=meta, slots=both[at:], kv_caches=caches,
                         num_seqs=len(spans), max_seqlen_q=max(q_lens), max_seqlen_k=max_k)
    return both[:len(ids)], meta.token_pos, ctx


@torch.inference_mode()
def run_step(model: CausalLM, caches: list[KVCache], spans: list[Span]) -> list[torch.Tensor]:
    """Logits [len(tokens), vocab] of every span, after writing the spans' keys into the caches."""
    input_ids, positions, ctx = step_inputs(model, caches, spans)
    with set_context(ctx):
        hidden = model(input_ids, positions)
    return list(model.logits(hidden).split([len(s.tokens) for s in spans]))


def prefill_batch(model: CausalLM, caches: list[KVCache], sequences: list[list[int]]) -> list[torch.Tensor]:
    """One prefill step of whole sequences, sequence i in the next contiguous pages after i - 1's."""
    spans, at = [], 0
    for tokens in sequences:
        n = -(-len(tokens) // model.page_size)
        spans.append(Span(list(tokens), 0, list(range(at, at + n))))
        at += n
    if at > caches[0][0].shape[0]:
        raise ValueError(f"{len(sequences)} sequences need {at} pages; the cache has {caches[0][0].shape[0]}")
    return run_step(model, caches, spans)


LOGITS_BLOCK_ROWS = 4096  # completion rows whose LM-head logits exist at once (~1.2 GB at a 151,936 vocab)


def completion_logprobs(model: CausalLM, sequences: list[tuple[list[int], int]], temperatures: list[float],
                        block_rows: int = LOGITS_BLOCK_ROWS, sglang: Optional[tuple[int, int]] = None
                        ) -> list[torch.Tensor]:
    """The trainer's computation: fp32 logprobs [len - prompt] of each (tokens, prompt length)'s
    completion at its temperature, from ONE prefill step of all the sequences in fresh pages.

    Differentiable when grad is enabled and the weights require it (kernels.autograd); with the
    pinned selections its bits are the rollout's, whatever the batch. The sequence's last token
    is the completion's last: nothing is predicted after it.

    The LM head and the log-softmax run on `block_rows` completion rows at a time; with grad, each
    block's logits are recomputed in the backward (torch.utils.checkpoint) instead of kept, so a
    long-completion micro-batch holds one block's [rows, vocab] logits, not all of them. A row's
    bits do not see the block (pinned selections are batch-invariant).

    `sglang` = (split tile, context): the sequences were rolled out by SGLang under detent_rl's plugin
    (`rollout.backend: sglang`); attention then runs SGLang's own kernels the way the rollout ran them
    and the logprobs are its deterministic sampler's (`rollout/sglang_model.py`).
    """
    if len(sequences) != len(temperatures):
        raise ValueError(f"{len(sequences)} sequences but {len(temperatures)} temperatures")
    page = model.page_size
    spans, at = [], 0
    for i, (tokens, n_prompt) in enumerate(sequences):
        if not 1 <= n_prompt < len(tokens):
            raise ValueError(f"sequence {i}: prompt length {n_prompt} must be >= 1 and leave a completion "
                             f"in its {len(tokens)} tokens")
        pages = -(-len(tokens) // page)
        spans.append(Span(list(tokens), 0, list(range(at, at + pages))))
        at += pages
    caches = model.allocate_kv_cache(at)
    input_ids, positions, ctx = step_inputs(model, caches, spans)
    if sglang is not None:
        cu = (0, *accumulate(len(tokens) for tokens, _ in sequences))
        ctx = replace(ctx, sglang=SGLangRows(cu, tuple(n for _, n in sequences), *sglang))
    with set_context(ctx):
        hidden = model(input_ids, positions)
    rows, targets, at = [], [], 0
    for tokens, n_prompt in sequences:  # the logits at position p predict token p + 1
        rows.extend(range(at + n_prompt - 1, at + len(tokens) - 1))
        targets.extend(tokens[n_prompt:])
        at += len(tokens)
    states = hidden[device_tensor(rows, torch.int64, hidden.device)]
    ids = device_tensor(targets, torch.int64, hidden.device)
    select = model.selections.get("log_softmax")
    segments, at = [], 0  # (first row, rows, selection, temperature) per sequence
    for (tokens, n_prompt), t in zip(sequences, temperatures):
        n = len(tokens) - n_prompt
        # the row count the engine's sampler selects with; SGLang's sampler takes temperature 0 as greedy
        segments.append((at, n, select(n), t if sglang is not None else t or 1.0))
        at += n

    def block(lo: int, hi: int, h: torch.Tensor) -> torch.Tensor:
        """Logprobs of completion rows [lo, hi) from their hidden states h."""
        parts = []  # (first row, rows, block, warps, temperature) of each sequence's rows in the block
        for first, n, cfg, t in segments:
            a, b = max(first, lo), min(first + n, hi)
            if a < b:
                parts.append((a - lo, b - a, cfg.block, cfg.num_warps, t))
        if sglang is not None:
            from detent_rl.rollout.sglang_model import token_logprobs
            logits = model.logits(h)
            return torch.cat([token_logprobs(logits[a:a + n], ids[lo + a:lo + a + n], t) for a, n, _, _, t in parts])
        return token_logprobs_segments_autograd(model.logits(h), ids[lo:hi], parts)

    recompute = torch.is_grad_enabled() and states.requires_grad and len(rows) > block_rows
    blocks = []
    for lo in range(0, len(rows), block_rows):
        hi = min(lo + block_rows, len(rows))
        if recompute:
            blocks.append(checkpoint(block, lo, hi, states[lo:hi], use_reentrant=False))
        else:
            blocks.append(block(lo, hi, states[lo:hi]))
    flat = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
    return list(flat.split([n for _, n, _, _ in segments]))


class SequenceRunner:
    """Sequences by slot id, each owning a fixed contiguous run of pages, extended step by step."""

    def __init__(self, model: CausalLM, max_seqs: int, max_len: int) -> None:
        self.model = model
        self.pages_per_seq = -(-max_len // model.page_size)
        self.caches = model.allocate_kv_cache(max_seqs * self.pages_per_seq)
        self.max_seqs = max_seqs
        self.lengths = [0] * max_seqs

    def step(self, work: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Append tokens to sequences `(slot, tokens)` in one step; logits of each span's tokens."""
        spans = []
        for slot, tokens in work:
            if not 0 <= slot < self.max_seqs:
                raise ValueError(f"sequence slot {slot} is outside [0, {self.max_seqs})")
            first = slot * self.pages_per_seq
            spans.append(Span(list(tokens), self.lengths[slot], list(range(first, first + self.pages_per_seq))))
        out = run_step(self.model, self.caches, spans)
        for slot, tokens in work:
            self.lengths[slot] += len(tokens)
        return out

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0  # its pages are simply overwritten by the next sequence in the slot
