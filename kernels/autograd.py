"""Autograd for the trainer: the forward runs our kernels, the backward differentiates a reference.

The trainer's forward must give the rollout's bits (importance ratio exactly 1.0 on the first
minibatch), so each op's forward here IS the kernel call the engine makes, with the same selected
parameters — `torch.autograd.Function.forward` runs it unchanged, without recording a graph. The
backward only has to be a correct (and deterministic) gradient, not a bit-exact one. Linear,
embedding, RMSNorm, SiLU-and-mul, rotary and the token log-softmax have closed forms, a kernel or a
few tensor ops each from the saved inputs (no reference forward recomputed under autograd: the update
was bound by the host launching those ops); attention differentiates its PyTorch formula (SDPA over
padded batches), taken on the padded tensors themselves. Every backward is deterministic (the
trainer's runs and resumes repeat bit for bit). Each wrapper calls the kernel directly when no input
needs a gradient, so inference pays nothing.

Names: `<op>_autograd` is the op the model layers call. It wraps the kernel launcher `<op>`
(`kernels/<family>.py`, with its PyTorch reference `<op>_ref`), whose parameters the family's SelIR
program `<family>_program` (`kernels/programs/`) selects.

Attention differentiates only the trainer's shape: one prefill per sequence from position 0, its
keys all in the step (a cached prefix has no gradient path); other steps are refused.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from detent_rl.kernels.attention import AttnMeta, device_tensor, paged_attention
from detent_rl.kernels.embedding import embedding
from detent_rl.kernels.kv_store import store_kv
from detent_rl.kernels.log_softmax import token_logprobs
from detent_rl.kernels.matmul import linear
from detent_rl.kernels.rmsnorm import rmsnorm, rmsnorm_backward
from detent_rl.kernels.rotary import apply_rotary, rotary_store
from detent_rl.kernels.silu_and_mul import silu_and_mul, silu_and_mul_backward


def _needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], launch: dict) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return linear(x, w, b, **launch)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        g = g.to(x.dtype)  # an fp32 output (a TP partial, `out_dtype`) takes its gradient in the compute dtype
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
        if g.is_cuda:  # sorted by token, each row summed in fp32 by one thread: deterministic (index_add_'s
            # float atomics on the GPU are not), as the trainer's resume must be
            gw = torch.ops.aten.embedding_dense_backward(g.reshape(-1, ctx.shape[1]), ids.reshape(-1).long(),
                                                         ctx.shape[0], -1, False)
            return None, gw.to(g.dtype), None
        gw = torch.zeros(ctx.shape, dtype=torch.float32, device=g.device)
        gw.index_add_(0, ids.reshape(-1).long(), g.reshape(-1, ctx.shape[1]).float())
        return None, gw.to(g.dtype), None


class _RMSNorm(torch.autograd.Function):
    """rmsnorm (after the residual add h = residual + x): out = w * round(h * rstd); the backward is
    `rmsnorm_backward` (one kernel on the GPU) from the saved h."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor], eps: float,
                block: int, num_warps: int) -> Any:
        out = rmsnorm(x, weight, eps, block=block, num_warps=num_warps, residual=residual)
        ctx.save_for_backward(x if residual is None else out[1], weight)
        ctx.eps, ctx.has_residual = eps, residual is not None
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, g_h: Optional[torch.Tensor] = None) -> tuple:
        h, w = ctx.saved_tensors
        dh, gw = rmsnorm_backward(h, w, g, g_h, ctx.eps)
        return dh, gw if ctx.needs_input_grad[1] else None, dh if ctx.has_residual else None, None, None, None


class _SiluAndMul(torch.autograd.Function):
    """silu(a) * b for x = [a | b]; the backward is `silu_and_mul_backward` (one kernel on the GPU)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, block: int) -> torch.Tensor:
        ctx.save_for_backward(x)
        return silu_and_mul(x, block=block)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        return silu_and_mul_backward(x, g), None


class _Rotary(torch.autograd.Function):
    """q, k rotated by their positions' angles (the rotary part, the first cos.shape[1] of each head):
    x' = x * cos + rotate_half(x) * sin, an orthogonal map, so the gradient is the rotation back —
    `apply_rotary` with -sin (the same kernel; the rest of a head passes its gradient through)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(positions, cos, sin)
        ctx.block = block
        return apply_rotary(q, k, positions, cos, sin, block=block)

    @staticmethod
    def backward(ctx: Any, gq: Optional[torch.Tensor], gk: Optional[torch.Tensor]) -> tuple:
        positions, cos, sin = ctx.saved_tensors
        gq, gk = apply_rotary(gq.contiguous(), gk.contiguous(), positions, cos, torch.neg(sin), block=ctx.block)
        return gq, gk, None, None, None, None


class _TokenLogprobs(torch.autograd.Function):
    """Each row's log-softmax at its token, the rows cut into segments with their own kernel selection
    and temperature (one sequence's completion each: the engine's sampler calls). One closed-form
    backward for all of them: d logits = g * (onehot(token) - softmax(logits / t)) / t."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, token_ids: torch.Tensor, segments: tuple) -> torch.Tensor:
        ctx.save_for_backward(logits, token_ids)
        ctx.segments = segments
        return _segment_logprobs(logits, token_ids, segments)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        logits, ids = ctx.saved_tensors
        inv_t = device_tensor([1.0 / (t or 1.0) for _, n, _, _, t in ctx.segments for _ in range(n)],
                              torch.float32, logits.device)[:, None]
        p = torch.softmax(logits.float() * inv_t, dim=-1)
        scale = g.float()[:, None] * inv_t
        p.mul_(-scale)
        p.scatter_add_(1, ids.long()[:, None], scale)
        return p.to(logits.dtype), None, None


def _segment_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, segments: tuple) -> torch.Tensor:
    parts = [token_logprobs(logits[a:a + n], token_ids[a:a + n], block=block, num_warps=warps, temperature=t)
             for a, n, block, warps, t in segments]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def token_logprobs_segments_autograd(logits: torch.Tensor, token_ids: torch.Tensor,
                                     segments: list[tuple[int, int, int, int, float]]) -> torch.Tensor:
    """fp32 logprobs of `token_ids` under `logits` [rows, vocab], rows cut into consecutive segments
    (first row, rows, block, num_warps, temperature) that together cover every row in order."""
    assert sum(n for _, n, *_ in segments) == logits.shape[0], "segments must cover the rows"
    if not _needs_grad(logits):
        return _segment_logprobs(logits, token_ids, tuple(segments))
    return _TokenLogprobs.apply(logits, token_ids, tuple(segments))


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
    return _RMSNorm.apply(x, weight, residual, eps, block, num_warps)


def silu_and_mul_autograd(x: torch.Tensor, *, block: int) -> torch.Tensor:
    if not _needs_grad(x):
        return silu_and_mul(x, block=block)
    return _SiluAndMul.apply(x, block)


def rotary_autograd(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    *, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k) by `apply_rotary`, differentiable; nothing stored."""
    if not _needs_grad(q, k):
        return apply_rotary(q.contiguous(), k.contiguous(), positions, cos, sin, block=block)
    return _Rotary.apply(q.contiguous(), k.contiguous(), positions, cos, sin, block)


def rotary_store_autograd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slots: torch.Tensor, *, block: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotated (q, k). Without a gradient one launch also stores k and v into the caches and k comes
    back None (stored); with one, `attention_autograd` stores the returned k (the same bits)."""
    if not _needs_grad(q, k, v):
        return rotary_store(q, k, v, positions, cos, sin, k_cache, v_cache, slots, block=block), None
    return _Rotary.apply(q, k, positions, cos, sin, block)


# fp32 attention scores one padded call may hold ([B, H, L, L]); longer sequences go in smaller
# groups (one alone at worst), so a long-context micro-batch does not multiply the peak.
ATTENTION_REF_SCORE_BYTES = 1 << 30


def _groups(cu_q: list[int], heads: int, score_bytes: int, device: torch.device
            ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Consecutive runs of sequences whose padded fp32 scores fit `score_bytes`: per run its rows and
    `_padding`'s (index, sequence, position) tensors."""
    lengths = [e - s for s, e in zip(cu_q, cu_q[1:])]
    first = 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or (i - first + 1) * heads * max(lengths[first:i + 1]) ** 2 * 4 > score_bytes:
            yield (slice(cu_q[first], cu_q[i]), *_padding(tuple(lengths[first:i]), device))
            first = i


@functools.lru_cache(maxsize=16)
def _padding(lengths: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For sequences of these lengths packed end to end (T rows): the padded batch's gather index [B, L]
    into the rows plus one zero row (index T: every pad), and each row's (sequence, position) in the
    batch. Built on the host and copied without a device sync; every layer of a micro-batch asks for
    the same ones."""
    n = torch.tensor(lengths)
    first = torch.cumsum(n, 0) - n
    pos = torch.arange(max(lengths))
    real = pos < n[:, None]  # [B, L]
    index = torch.where(real, first[:, None] + pos, int(n.sum()))
    seq, at = real.nonzero(as_tuple=True)  # row-major: the rows in token order
    return tuple(t.to(device, non_blocking=True) for t in (index, seq, at))


def _pad(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[T, h, D] rows -> [B, h, L, D], pads zero; fp32 on the CPU (its 16-bit attention is slow)."""
    x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])[index]
    return (x if x.is_cuda else x.float()).transpose(1, 2)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of padded [B, H, L, D] batches (k, v repeated up to q's heads), fp32 inside. On
    the GPU in the inputs' dtype (fp32 accumulation, P rounded to the value dtype before P @ V, as the
    forward kernel does): FlashAttention for 16-bit models, the memory-efficient kernel for fp32 ones.
    Under PyTorch's deterministic algorithms (`_deterministic`) both backwards are deterministic; on the
    H200 flash's is 2.5x (2,304 tokens) to 12x (8,448) faster than the memory-efficient one's there, and
    without the setting both differ from run to run (docs/BENCHMARKS.md). The math kernel would need
    cuBLAS's deterministic workspace setting."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    flash = q.dtype in (torch.bfloat16, torch.float16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION if flash else SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def _attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: list[int], scale: float,
                   score_bytes: int = ATTENTION_REF_SCORE_BYTES) -> torch.Tensor:
    """Causal attention of each sequence's rows over its own keys (all new in this step), differentiable
    by autograd: the formula `_attention_backward` differentiates (`_sdpa`). Consecutive sequences are
    padded at their ends into one [B, H, L, D] batch and attended in one causal call per group; pad
    rows are zeros at the ends, never seen by a real row (they come later), their outputs dropped."""
    outs = []
    for rows, index, seq, at in _groups(cu_q, q.shape[1], score_bytes, q.device):
        o = _sdpa(_pad(q[rows], index), _pad(k[rows], index), _pad(v[rows], index), scale)
        outs.append(o.transpose(1, 2)[seq, at].to(q.dtype))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, cu_q: list[int],
                        scale: float, score_bytes: int = ATTENTION_REF_SCORE_BYTES
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradient of `_attention_ref` for the output's gradient g, taken on the padded batches
    themselves (their gathers are each row once, so the gradients come back by a gather: no
    accumulating scatter, no autograd graph around them), under PyTorch's deterministic algorithms."""
    grads = []
    with _deterministic():
        for rows, index, seq, at in _groups(cu_q, q.shape[1], score_bytes, q.device):
            leaves = [_pad(x[rows], index).requires_grad_(True) for x in (q, k, v)]
            with torch.enable_grad():
                o = _sdpa(*leaves, scale)
            found = torch.autograd.grad(o, leaves, _pad(g[rows], index))
            grads.append([d.transpose(1, 2)[seq, at].to(q.dtype) for d in found])
    if len(grads) == 1:
        return tuple(grads[0])
    return tuple(torch.cat(parts) for parts in zip(*grads))


def _flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    g: torch.Tensor, cu_q: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradient of causal attention by FlashAttention's varlen backward (PyTorch's build), at our
    forward's own output and log-sum-exp ([H, T]): no forward recomputed for them (the padded path's
    autograd.grad reran flash's forward, 96 of 334 ms of a 1.5B long-context backward on the H200),
    no padding, the GQA heads summed by the kernel (k, v not repeated). Deterministic under PyTorch's
    deterministic algorithms (its dq accumulation then runs in a fixed order)."""
    cu = device_tensor(cu_q, torch.int32, q.device)
    longest = max(b - a for a, b in zip(cu_q, cu_q[1:]))
    rng = torch.empty(2, dtype=torch.uint64, device=q.device)  # dropout 0: no Philox state is read
    with _deterministic():
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            g.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out, lse, cu, cu, longest, longest,
            0.0, True, rng, rng.new_empty(()), scale=scale)
    return dq, dk, dv


def flash_backward_applies(q: torch.Tensor) -> bool:
    """16-bit CUDA attention takes `_flash_backward`; fp32 and the CPU the padded SDPA path."""
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


class _Attention(torch.autograd.Function):
    """The engine's store_kv + paged_attention for a one-shot prefill; the gradient by `_flash_backward`
    (16-bit, CUDA: the forward also writes each row's log-sum-exp) or `_attention_backward`."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: Callable, cu: list[int],
                scale: float) -> torch.Tensor:
        ctx.cu, ctx.scale, ctx.flash = cu, scale, flash_backward_applies(q)
        if ctx.flash:
            lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
            out = kernel(q, k, v, lse)
            ctx.save_for_backward(q, k, v, out, lse)
            return out
        ctx.save_for_backward(q, k, v)
        return kernel(q, k, v)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        if ctx.flash:
            q, k, v, out, lse = ctx.saved_tensors
            return (*_flash_backward(q, k, v, out, lse, g, ctx.cu, ctx.scale), None, None, None)
        q, k, v = ctx.saved_tensors
        return (*_attention_backward(q, k, v, g, ctx.cu, ctx.scale), None, None, None)


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """PyTorch's deterministic algorithms for the body, without its filling of fresh tensors (the
    backward writes all it allocates), the caller's settings restored after."""
    import torch.utils.deterministic as det
    before, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    det.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn)
        det.fill_uninitialized_memory = fill


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
    assert params.get("out") is None, "a differentiable attention step returns a new output (autograd's)"
    pos0 = meta.pos0_host if meta.pos0_host is not None else meta.pos0.tolist()
    if any(pos0):
        raise ValueError("a differentiable attention step must prefill every sequence from position 0 "
                         "(its keys all in the step); this step has a cached prefix")
    cu = list(meta.cu_q_host) if meta.cu_q_host is not None else meta.cu_q.tolist()

    def kernel(q, k, v, lse=None):
        store_kv(k, v, k_cache, v_cache, slots)
        return paged_attention(q, k_cache, v_cache, meta, scale=scale, lse=lse, **params)

    return _Attention.apply(q, k, v, kernel, cu, scale)
