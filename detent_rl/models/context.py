"""The one attention-metadata object of a forward step, set around the forward and always reset.

Model forwards take only `(input_ids, positions)`; everything attention needs beyond that — which
query rows belong to which sequence, where the step's keys go in the paged cache, the caches
themselves — travels here. That keeps the forward the same for the engine's prefill, its decode
(and a CUDA-graph capture of it) and the trainer's one-shot prefill.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from detent_rl.kernels.attention import AttnMeta

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache), each [pages, page_size, kv_heads, head_dim]


@dataclass(frozen=True)
class ForwardContext:
    meta: AttnMeta
    slots: torch.Tensor  # int64 [T], flat cache slot (page * page_size + offset) of each new token
    kv_caches: list[KVCache]  # one (k, v) pair per decoder layer
    num_seqs: int
    max_seqlen_q: int  # the most query rows of one sequence in this step
    max_seqlen_k: int  # the longest key span (cached + new) of one sequence in this step
    # the trainer reproducing an SGLang rollout (rollout.backend: sglang): SGLang's own attention kernels
    # give each row the bits the rollout gave it (rollout/sglang_attention.py); None: our paged attention
    sglang: Optional["SGLangRows"] = None


@dataclass(frozen=True)
class SGLangRows:
    """How SGLang's pinned Triton backend computed a one-shot prefill's rows: sequence i is rows
    cu[i]:cu[i + 1], its first prompt_lens[i] by the extend kernel, the rest decoded with `tile`-key splits
    on a deployment of `context` tokens (the decode kernel's split buffers)."""
    cu: tuple[int, ...]
    prompt_lens: tuple[int, ...]
    tile: int
    context: int


_current: Optional[ForwardContext] = None


@contextmanager
def set_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    """Make `ctx` the current context for the body; the previous one is restored even on error."""
    global _current
    previous, _current = _current, ctx
    try:
        yield ctx
    finally:
        _current = previous


def get_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("no forward context is set: run the model inside `with set_context(ctx):`")
    return _current
