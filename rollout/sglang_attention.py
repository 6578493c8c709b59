"""The trainer's attention for sequences SGLang rolled out under the DETENT plugin, with SGLang's own
Triton kernels, so that every row has the bits SGLang's rollout gave it.

Under the plugin SGLang's Triton backend computes a sequence's rows two ways:

- **prompt rows** by the extend (prefill) kernel. The plugin turns on the backend's deterministic
  extend path, SGLang's unified one-stage kernel: a row walks its keys (cached prefix and new
  chunk alike, through one index list) in the kernel's fixed KV tiles from key 0, so chunked
  prefill, prefix-cache hits and the batch around it leave its bits alone. (The default two-stage
  kernel walks the cached prefix and the new chunk as two separate passes, so where a chunk starts
  moves the bits.)
- **completion rows** by the decode kernel, one step per token: row p (the query of the token at
  position p) over keys 0..p, cut into `ceil((p + 1) / tile)` splits of the committed tile, the
  splits combined by SGLang's second stage.

A trainer's usual one-shot prefill would give completion rows the extend kernel's bits, which are
not the decode kernel's (no splits, another tiling). So `rollout_attention` runs the same two
kernels on the trainer's packed sequences: the prompts through the unified extend kernel in one
call, and every completion row as a one-query "request" of the decode kernel whose keys are its
sequence's 0..p, with the pinned split count. Both kernels are batch-invariant under the plugin's
selection, so computing all rows at once gives each the bits it had when it was decoded alone among
other requests. Completion rows go `rows_per_call` at a time (the decode kernel's split buffers hold
rows x heads x splits x head_dim fp32 values).

Forward only: the trainer's backward may take any deterministic gradient of attention (it is not
compared), as `kernels/autograd.py` does for our own kernels.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any

import torch

DEFAULT_ROWS_PER_CALL = 512


def rollout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int],
                      prompt_lens: list[int], *, tile: int, context: int, scale: float,
                      rows_per_call: int = DEFAULT_ROWS_PER_CALL) -> torch.Tensor:
    """Causal attention of packed sequences (q [T, H, D], k and v [T, KVH, D]; sequence i is rows
    cu_seqlens[i]:cu_seqlens[i + 1], its first prompt_lens[i] rows its prompt) with the bits of SGLang's
    rollout under the plugin's split `tile` (its commitment tuple's `split_tile_size`) on a deployment
    of `context` tokens (SGLang's max_context_len: the decode kernel's split buffers, a constexpr of
    its combine, are sized ceil(context / tile), as the plugin sizes them)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified
    from detent_rl.rollout.sglang_plugin import split_counts
    if len(cu_seqlens) != len(prompt_lens) + 1 or cu_seqlens[0] != 0 or cu_seqlens[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens {cu_seqlens[:4]}... must run from 0 to {q.shape[0]} with one sequence per "
                         f"prompt length ({len(prompt_lens)})")
    lens = [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])]
    bad = [i for i, (n, p) in enumerate(zip(lens, prompt_lens)) if not 1 <= p <= n]
    if bad:
        raise ValueError(f"sequences {bad[:4]}: a prompt length must be 1..the sequence's length")
    if max(lens) > context:
        raise ValueError(f"a sequence of {max(lens)} tokens exceeds the deployment's context of {context}")
    dev, H = q.device, q.shape[1]
    i32 = dict(dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    # the prompts: one unified extend call, no cached prefix
    prompt_rows = torch.cat([torch.arange(a, a + p, device=dev) for a, p in zip(cu_seqlens, prompt_lens)])
    qo = torch.tensor([0] + list(accumulate(prompt_lens)), **i32)
    o = torch.empty((prompt_rows.shape[0], H, v.shape[2]), dtype=q.dtype, device=dev)
    extend_attention_fwd_unified(q[prompt_rows].contiguous(), o, k, v, 1.0, 1.0, qo, qo, prompt_rows.to(torch.int32),
                                 torch.zeros(len(lens), **i32), max(prompt_lens), sm_scale=scale, is_causal=True)
    out[prompt_rows] = o
    # the completion rows: each a decode step of its own, over its sequence's keys 0..p
    rows = [(a + p, a) for a, n, pl in zip(cu_seqlens, lens, prompt_lens) for p in range(pl, n)]
    splits_max = -(-context // tile)
    for at in range(0, len(rows), rows_per_call):
        part = rows[at:at + rows_per_call]
        kv_lens = [r - a + 1 for r, a in part]
        indptr = torch.tensor([0] + list(accumulate(kv_lens)), **i32)
        indices = torch.cat([torch.arange(a, r + 1, **i32) for r, a in part])
        splits = split_counts(torch.tensor(kv_lens, **i32), tile)  # the plugin's pinned count
        logits = torch.empty((len(part), H, splits_max, v.shape[2]), dtype=torch.float32, device=dev)
        lse = torch.empty((len(part), H, splits_max), dtype=torch.float32, device=dev)
        o = torch.empty((len(part), H, v.shape[2]), dtype=q.dtype, device=dev)
        index = torch.tensor([r for r, _ in part], device=dev)
        decode_attention_fwd(q[index].contiguous(), k, v, o, indptr, indices, logits, lse, splits, splits_max,
                             scale, 1.0, 1.0)
        out[index] = o
    return out



class _SGLangAttention(torch.autograd.Function):
    """`rollout_attention` forward (the rollout's bits); the gradient of causal attention by the
    trainer's deterministic reference backward (`kernels.autograd._attention_backward`): the backward
    is not compared, only the forward's logprobs are."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Any, scale: float) -> torch.Tensor:
        ctx.cu, ctx.scale = list(rows.cu), scale
        ctx.save_for_backward(q, k, v)
        return rollout_attention(q, k, v, list(rows.cu), list(rows.prompt_lens), tile=rows.tile,
                                 context=rows.context, scale=scale)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        from detent_rl.kernels.autograd import _attention_backward
        q, k, v = ctx.saved_tensors
        return (*_attention_backward(q, k, v, g.contiguous(), ctx.cu, ctx.scale), None, None)


def sglang_attention_autograd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Any,
                              scale: float) -> torch.Tensor:
    """Causal attention of the packed sequences `rows` (models.context.SGLangRows) with SGLang's rollout
    bits; differentiable."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return rollout_attention(q, k, v, list(rows.cu), list(rows.prompt_lens), tile=rows.tile,
                                 context=rows.context, scale=scale)
    return _SGLangAttention.apply(q, k, v, rows, scale)
