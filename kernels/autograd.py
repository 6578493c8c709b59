"""Autograd for the trainer: the forward runs our kernels, the backward differentiates a reference.

The trainer's forward must give the rollout's bits (importance ratio exactly 1.0 on the first
minibatch), so each op's forward here IS the kernel call the engine makes, with the same selected
parameters — `torch.autograd.Function.forward` runs it unchanged, without recording a graph. The
backward only has to be a correct gradient, not a bit-exact one: it differentiates the op's plain
PyTorch reference (the formula the kernel computes, in the same dtypes), recomputed from the saved
inputs; linear and embedding have closed forms. Each wrapper calls the kernel directly when no
input needs a gradient, so inference pays nothing.

Names: `<op>_autograd` is the op the model layers call. It wraps the kernel launcher `<op>`
(`kernels/<family>.py`, with its PyTorch reference `<op>_ref`), whose parameters the family's SelIR
program `<family>_program` (`kernels/programs/`) selects.

Attention differentiates only the trainer's shape: one prefill per sequence from position 0, its
keys all in the step (a cached prefix has no gradient path); other steps are refused.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from detent_rl.kernels.attention import AttnMeta, paged_attention, store_kv
from detent_rl.kernels.embedding import embedding
from detent_rl.kernels.log_softmax import token_logprobs, token_logprobs_ref
from detent_rl.kernels.matmul import linear
from detent_rl.kernels.rmsnorm import rmsnorm, rmsnorm_ref
from detent_rl.kernels.rotary import apply_rotary, apply_rotary_ref, rotary_store
from detent_rl.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref


def _needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class _RefGrad(torch.autograd.Function):
    """out = kernel(*inputs); d/dinputs from ref(*inputs). Outputs may be a tuple."""

    @staticmethod
    def forward(ctx: Any, kernel: Callable, ref: Callable, *inputs: Any) -> Any:
        ctx.ref = ref
        ctx.tensor_at = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        ctx.others = [None if isinstance(x, torch.Tensor) else x for x in inputs]
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_at))
        out = kernel(*inputs)
        ctx.is_tuple = isinstance(out, tuple)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        saved = ctx.saved_tensors
        args = list(ctx.others)
        leaves = []
        for i, t in zip(ctx.tensor_at, saved):
            leaf = t.detach().requires_grad_(t.requires_grad and t.is_floating_point())
            args[i] = leaf
            if leaf.requires_grad:
                leaves.append((i, leaf))
        with torch.enable_grad():
            out = ctx.ref(*args)
        outs = out if ctx.is_tuple else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        result: list[Optional[torch.Tensor]] = [None] * len(args)
        if pairs and leaves:
            found = torch.autograd.grad([o for o, _ in pairs], [leaf for _, leaf in leaves],
                                        [g for _, g in pairs], allow_unused=True)
            for (i, _), g in zip(leaves, found):
                result[i] = g
        return (None, None, *result)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], launch: dict) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return linear(x, w, b, **launch)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        # CPU 16-bit matmuls are an order of magnitude slower than fp32 ones: compute there in fp32
        up = (lambda t: t.float()) if not g.is_cuda and g.dtype != torch.float32 else (lambda t: t)
        gx = (up(g) @ up(w)).to(x.dtype) if ctx.needs_input_grad[0] else None
        gw = (up(g).t() @ up(x)).to(w.dtype) if ctx.needs_input_grad[1] else None
        gb = g.float().sum(0).to(g.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.shape = weight.shape
        return embedding(ids, weight, block=block)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        (ids,) = ctx.saved_tensors
        gw = torch.zeros(ctx.shape, dtype=torch.float32, device=g.device)
        gw.index_add_(0, ids.reshape(-1).long(), g.reshape(-1, ctx.shape[1]).float())
        return None, gw.to(g.dtype), None


def linear_autograd(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], launch: dict) -> torch.Tensor:
    """`linear(x, w, b, **launch)`, `launch` from `matmul.launch_params(selection)`."""
    if not _needs_grad(x, w, b):
        return linear(x, w, b, **launch)
    return _Linear.apply(x, w, b, launch)


def embedding_autograd(ids: torch.Tensor, weight: torch.Tensor, *, block: int) -> torch.Tensor:
    if not _needs_grad(weight):
        return embedding(ids, weight, block=block)
    return _Embedding.apply(ids, weight, block)


def rmsnorm_autograd(x: torch.Tensor, weight: torch.Tensor, eps: float, *, block: int, num_warps: int,
                     residual: Optional[torch.Tensor] = None) -> Any:
    if not _needs_grad(x, weight, residual):
        return rmsnorm(x, weight, eps, block=block, num_warps=num_warps, residual=residual)
    return _RefGrad.apply(
        lambda x, w, r: rmsnorm(x, w, eps, block=block, num_warps=num_warps, residual=r),
        lambda x, w, r: rmsnorm_ref(x, w, eps, residual=r), x, weight, residual)


def silu_and_mul_autograd(x: torch.Tensor, *, block: int) -> torch.Tensor:
    if not _needs_grad(x):
        return silu_and_mul(x, block=block)
    return _RefGrad.apply(lambda x: silu_and_mul(x, block=block), silu_and_mul_ref, x)


def rotary_store_autograd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slots: torch.Tensor, *, block: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotated (q, k). Without a gradient one launch also stores k and v into the caches and k comes
    back None (stored); with one, `attention_autograd` stores the returned k (the same bits)."""
    if not _needs_grad(q, k, v):
        return rotary_store(q, k, v, positions, cos, sin, k_cache, v_cache, slots, block=block), None
    # the kernels need a contiguous last dim, and so does HF's reference on views of the fused qkv
    return _RefGrad.apply(lambda q, k, p, c, s: apply_rotary(q, k, p, c, s, block=block), apply_rotary_ref,
                          q, k, positions, cos, sin)


def token_logprobs_autograd(logits: torch.Tensor, token_ids: torch.Tensor, *, block: int, num_warps: int,
                            temperature: float = 1.0) -> torch.Tensor:
    if not _needs_grad(logits):
        return token_logprobs(logits, token_ids, block=block, num_warps=num_warps, temperature=temperature)
    return _RefGrad.apply(
        lambda x, t: token_logprobs(x, t, block=block, num_warps=num_warps, temperature=temperature),
        lambda x, t: token_logprobs_ref(x, t, temperature=temperature), logits, token_ids)


# fp32 attention scores one padded reference call may hold ([B, H, L, L]); longer sequences go in
# smaller groups (one alone at worst), so a long-context micro-batch does not multiply the peak.
ATTENTION_REF_SCORE_BYTES = 1 << 30


def _attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: list[int], scale: float,
                   score_bytes: int = ATTENTION_REF_SCORE_BYTES) -> torch.Tensor:
    """Causal attention of each sequence's rows over its own keys (all new in this step), fp32 inside.

    Consecutive sequences are padded at their ends into one [B, H, L, D] batch and attended in ONE
    causal call per group (one call per layer for a GRPO micro-batch, instead of one per sequence:
    the backward was bound by kernel launches). A pad row repeats its sequence's first row: a real
    row never sees it (it comes later), and the pad rows' outputs are dropped, so no gradient flows
    through them.
    """
    heads = q.shape[1]
    lengths = [e - s for s, e in zip(cu_q, cu_q[1:])]
    groups, first = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or (i - first + 1) * heads * max(lengths[first:i + 1]) ** 2 * 4 > score_bytes:
            groups.append((first, i))
            first = i
    return torch.cat([_padded_attention(q, k, v, cu_q[a:b], lengths[a:b], scale) for a, b in groups])


def _padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: list[int], lengths: list[int],
                      scale: float) -> torch.Tensor:
    device, heads = q.device, q.shape[1]
    pos = torch.arange(max(lengths), device=device)
    first = torch.tensor(starts, device=device)[:, None]
    real = pos < torch.tensor(lengths, device=device)[:, None]  # [B, L]
    index = torch.where(real, first + pos, first)

    def padded(x: torch.Tensor) -> torch.Tensor:  # [T, h, D] -> [B, heads, L, D] fp32
        return x[index].float().repeat_interleave(heads // x.shape[1], 2).transpose(1, 2)

    o = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), is_causal=True, scale=scale)
    # the kernel rounds P to the value dtype before P @ V; the gradient ignores that rounding
    return o.transpose(1, 2)[real].to(q.dtype)


def attention_autograd(q: torch.Tensor, k: Optional[torch.Tensor], v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slots: torch.Tensor, meta: AttnMeta, *, scale: float,
                       **params: Any) -> torch.Tensor:
    """store_kv + paged_attention (the engine's two calls); differentiable for one-shot prefills.
    k None: `rotary_store_autograd` already stored the step's k and v."""
    if not _needs_grad(q, k, v):
        if k is not None:
            store_kv(k, v, k_cache, v_cache, slots)
        return paged_attention(q, k_cache, v_cache, meta, scale=scale, **params)
    assert k is not None, "a differentiable step stores its own keys (rotary_store_autograd returns them)"
    if bool((meta.pos0 != 0).any()):
        raise ValueError("a differentiable attention step must prefill every sequence from position 0 "
                         "(its keys all in the step); this step has a cached prefix")
    cu = meta.cu_q.tolist()

    def kernel(q, k, v):
        store_kv(k, v, k_cache, v_cache, slots)
        return paged_attention(q, k_cache, v_cache, meta, scale=scale, **params)

    return _RefGrad.apply(kernel, lambda q, k, v: _attention_ref(q, k, v, cu, scale), q, k, v)
