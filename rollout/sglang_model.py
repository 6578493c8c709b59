"""DETENT for SGLang, the model's kernels: SGLang's own layers run detent_rl's invariant kernels, pinned by
the same commitment tuple as the trainer, so the trainer's forward can reproduce SGLang's rollout.

The selection hooks of `sglang_plugin` pin what SGLang *chooses* (attention splits, the MoE config row,
the all-reduce plan). What its dense layers call is not a choice the plugin can pin: the unquantized
linear method runs cuBLAS (or an M-dependent bf16 GEMM dispatch), whose reduction order follows the
token count, and the norm, activation and rotary ops are sgl_kernel's CUDA kernels, which a trainer
outside SGLang cannot call. So with a commitment tuple that records its deployment (the rollout worker
writes one, the trainer's own `selections.resolved()`), the plugin replaces them, through SGLang's
HookRegistry, by the kernels the trainer's model runs:

- `UnquantizedLinearMethod.apply` (every dense projection): `kernels.matmul.linear` with the site's
  pinned K partition (`matmul[k=..][n=..]` of the tuple; its default where the tuple has no entry),
  the schedule following M as in our engine. `apply_with_addend` (a GEMM with a fused residual) is
  refused: nothing in the trainer computes that sum.
- `LogitsProcessor._compute_lm_head`: the LM head by the same linear (site `matmul[k=hidden][n=vocab]`);
  LoRA-wrapped and quantized heads are refused.
- `RMSNorm.forward`: `kernels.rmsnorm` with the `rmsnorm[hidden=..]` site's pinned block, the residual
  added first (SGLang's fused_add_rmsnorm order: `residual = x + residual`, then the norm of it).
- `SiluAndMul.forward`: `kernels.silu_and_mul` (element-wise; its block is a schedule).
- `RotaryEmbedding.forward` (the plain class; scaled subclasses are refused): `kernels.rotary.apply_rotary`
  over a cos/sin table computed as the trainer computes it (`rope_cos_sin`), so both sides rotate by the
  same rounded values.
- `Sampler.__init__`: the sampler's deterministic path — logprobs by `torch.log_softmax` of the
  temperature-scaled fp32 logits, probabilities by `torch.softmax` — without SGLang's process-wide
  deterministic mode. `token_logprobs` below is the trainer's side of it.

Without a deployment in the tuple the model hooks stay off (`pinned()` says so): the kernels' selection
programs need the deployment's facts (the token bound, SM count, shared memory), and facts guessed
inside SGLang's process could differ from the trainer's.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.kernels.matmul import launch_params, linear
from detent_rl.kernels.rmsnorm import rmsnorm
from detent_rl.kernels.rotary import apply_rotary
from detent_rl.kernels.selections import Deployment, KernelSelections
from detent_rl.kernels.silu_and_mul import silu_and_mul

LINEAR_METHOD = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod"
LOGITS = "sglang.srt.layers.logits_processor.LogitsProcessor"
NORM = "sglang.srt.layers.layernorm.RMSNorm"
ACT = "sglang.srt.layers.activation.SiluAndMul"
ROPE = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding"
SAMPLER = "sglang.srt.layers.sampler.Sampler"
# (target, hook name in this module, hook type)
HOOKS = ((f"{LINEAR_METHOD}.apply", "pinned_linear", "REPLACE"),
         (f"{LINEAR_METHOD}.apply_with_addend", "refused_addend", "REPLACE"),
         (f"{LOGITS}._compute_lm_head", "pinned_lm_head", "REPLACE"),
         (f"{NORM}.forward", "pinned_rmsnorm", "REPLACE"),
         (f"{ACT}.forward", "pinned_silu_and_mul", "REPLACE"),
         (f"{ROPE}.forward", "pinned_rotary", "REPLACE"),
         (f"{SAMPLER}.__init__", "deterministic_sampler", "AFTER"))
# Targets a supported SGLang release lacks (0.5.17 has no fused-addend GEMM: nothing there to refuse).
ABSENT = {"0.5.17": {f"{LINEAR_METHOD}.apply_with_addend"}}

_STATE: dict = {"selections": None, "path": None, "rope": {}}


class SGLangModelError(RuntimeError):
    """SGLang's model asked the pinned kernels for something they do not compute the trainer's way."""


def configure(path: Optional[str], tuple_: Optional[CommitmentTuple]) -> bool:
    """Build the pinned selections from the tuple's deployment (True), or turn the model hooks off for a
    tuple without one, or no tuple (False)."""
    _STATE.update(selections=None, path=path, rope={})
    if tuple_ is None or tuple_.deployment is None:
        return False
    facts = {**Deployment.later_defaults(), **tuple_.deployment}
    try:
        deployment = Deployment(**facts)
    except TypeError as e:
        raise SGLangModelError(f"{path}: its deployment is not one detent_rl records ({e})") from e
    _STATE["selections"] = KernelSelections(deployment, "detent", tuple_)
    return True


def pinned() -> bool:
    """Whether SGLang's model layers run the pinned kernels (a tuple with a deployment was given)."""
    return _STATE["selections"] is not None


def register(registry: Any, hook_type: Any, version: str) -> None:
    """Register the model hooks with SGLang's HookRegistry (called by `sglang_plugin.register`), those of
    SGLang `version` (a supported release)."""
    for target, name, kind in HOOKS:
        if target not in ABSENT.get(version, ()):
            registry.register(target, globals()[name], getattr(hook_type, kind))


def _selections(what: str) -> KernelSelections:
    sel = _STATE["selections"]
    if sel is None:  # hooks applied by an earlier register() with a tuple, then reconfigured without one
        raise SGLangModelError(f"{what}: detent_rl's SGLang plugin has no deployment to pin the model's kernels "
                               f"with; give it a commitment tuple that records one ($DETENT_COMMITMENT)")
    return sel


def _linear(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], what: str) -> torch.Tensor:
    n, k = w.shape
    rows = x.reshape(-1, x.shape[-1])
    launch = launch_params(_selections(what).get("matmul", n=n, k=k)(rows.shape[0]))
    return linear(rows, w, bias, **launch).reshape(*x.shape[:-1], n)


def pinned_linear(method: Any, layer: Any, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """UnquantizedLinearMethod.apply: y = x W^T (+ b) by the pinned linear of site (n, k)."""
    return _linear(x, layer.weight, bias, "UnquantizedLinearMethod.apply")


def refused_addend(method: Any, layer: Any, x: torch.Tensor, addend: torch.Tensor, *args: Any, **kwargs: Any):
    raise SGLangModelError("UnquantizedLinearMethod.apply_with_addend: a GEMM with a fused residual has no "
                           "counterpart in the trainer's model; this model is not supported by detent_rl's SGLang "
                           "plugin with pinned model kernels")


def pinned_lm_head(proc: Any, hidden_states: torch.Tensor, lm_head: Any, embedding_bias: Optional[torch.Tensor] = None,
                   *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LogitsProcessor._compute_lm_head: the logits by the pinned linear, in the weight's dtype."""
    if hasattr(lm_head, "set_lora") or not isinstance(getattr(lm_head, "weight", None), torch.Tensor) \
            or getattr(proc, "use_fp32_lm_head", False):
        raise SGLangModelError("LogitsProcessor._compute_lm_head: a LoRA, quantized or fp32 LM head has no pinned "
                               "kernel in detent_rl's SGLang plugin")
    return _linear(hidden_states.to(lm_head.weight.dtype), lm_head.weight, embedding_bias, "the LM head")


def pinned_rmsnorm(norm: Any, x: torch.Tensor, residual: Optional[torch.Tensor] = None,
                   post_residual_addition: Optional[torch.Tensor] = None, *args: Any, **kwargs: Any):
    """RMSNorm.forward: out = norm(x), or with `residual`: (norm(x + residual), x + residual)."""
    if norm.variance_size_override is not None or norm.cast_x_before_out_mul or norm.fp32_residual:
        raise SGLangModelError("RMSNorm with a variance-size override, an early cast or an fp32 residual has no "
                               "pinned kernel in detent_rl's SGLang plugin")
    if residual is not None and post_residual_addition is not None:
        residual = residual + post_residual_addition  # SGLang's order on its fused path
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    s = _selections("RMSNorm").get("rmsnorm", hidden=shape[-1])(rows.shape[0])
    if residual is None:
        return rmsnorm(rows, norm.weight, norm.variance_epsilon, block=s.block, num_warps=s.num_warps).reshape(shape)
    out, total = rmsnorm(rows, norm.weight, norm.variance_epsilon, block=s.block, num_warps=s.num_warps,
                         residual=residual.reshape(-1, shape[-1]))
    return out.reshape(shape), total.reshape(residual.shape)


def pinned_silu_and_mul(act: Any, x: torch.Tensor) -> torch.Tensor:
    """SiluAndMul.forward: silu(x[..., :d]) * x[..., d:] by the element-wise kernel."""
    d = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    s = _selections("SiluAndMul").get("elementwise", width=d)(rows.shape[0])
    return silu_and_mul(rows, block=s.block).reshape(*x.shape[:-1], d)


class _RopeConfig:
    """The HF config fields `rope_cos_sin` reads, from an SGLang RotaryEmbedding."""

    def __init__(self, rope: Any) -> None:
        self.head_dim = rope.rotary_dim
        self.rope_parameters = {"rope_type": "default", "rope_theta": float(rope.base)}


def rope_table(rope: Any, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [max positions, rotary_dim] for an SGLang RotaryEmbedding, as the trainer computes them."""
    from detent_rl.kernels.rotary import rope_cos_sin
    key = (rope.rotary_dim, float(rope.base), rope.max_position_embeddings, str(device), dtype)
    table = _STATE["rope"].get(key)
    if table is None:
        table = _STATE["rope"][key] = rope_cos_sin(_RopeConfig(rope), rope.max_position_embeddings, device, dtype)
    return table


def pinned_rotary(rope: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                  offsets: Optional[torch.Tensor] = None, fused_set_kv_buffer_arg: Any = None,
                  *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """RotaryEmbedding.forward: neox-style rotation of q and k by the trainer's cos/sin table."""
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    if type(rope) is not RotaryEmbedding or not rope.is_neox_style or fused_set_kv_buffer_arg is not None:
        raise SGLangModelError(f"{type(rope).__name__} (neox style {rope.is_neox_style}, fused KV store "
                               f"{fused_set_kv_buffer_arg is not None}): detent_rl's SGLang plugin pins the plain "
                               f"neox-style rotary embedding only")
    if offsets is not None:
        positions = positions + offsets
    positions = positions.flatten()
    cos, sin = rope_table(rope, query.device, query.dtype)
    q = query.reshape(positions.shape[0], -1, rope.head_size)
    k = key.reshape(positions.shape[0], -1, rope.head_size)
    s = _selections("RotaryEmbedding").get("elementwise", width=q.shape[1] * rope.head_size)(q.shape[0])
    q, k = apply_rotary(q.contiguous(), k.contiguous(), positions, cos, sin, block=s.block)
    return q.reshape(query.shape), k.reshape(key.shape)


def deterministic_sampler(result: Any, sampler: Any, *args: Any, **kwargs: Any) -> None:
    """After Sampler.__init__: its deterministic path (log_softmax logprobs, torch.softmax probabilities)."""
    sampler.enable_deterministic = True


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The trainer's side of the pinned sampler: each row's logprob of its token, as SGLang's deterministic
    sampler returns it — the fp32 logits divided by a per-row temperature *tensor* (a Python-scalar
    divisor would be applied as a product with its reciprocal on the GPU: other bits), then
    `torch.log_softmax`. Temperature 0 (greedy) takes the unscaled logits, as SGLang does."""
    x = logits.float()
    if temperature > 0:
        x = x / torch.full((x.shape[0], 1), temperature, dtype=torch.float32, device=x.device)
    return torch.log_softmax(x, dim=-1).gather(1, tokens.reshape(-1, 1).long()).squeeze(1)
