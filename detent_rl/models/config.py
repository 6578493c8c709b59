"""The model facts our code reads from an HF `config.json`, validated once, frozen.

Only families whose computation the model code reproduces exactly are accepted: Llama (and its
derivatives such as SmolLM2), Qwen2 and Qwen3. Anything that would change the computation without
our code knowing — another activation, sliding-window layers, quantized weights — is refused here
with the file and the key, rather than producing plausible-looking wrong logits later.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import torch

MODEL_TYPES = ("llama", "qwen2", "qwen3")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelConfigError(ValueError):
    """A config.json this model code cannot reproduce; the message names the file and the key."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict]  # rope_parameters (transformers 5) or rope_scaling (4.x), as saved
    tie_word_embeddings: bool
    attention_bias: bool  # biases on q/k/v
    o_proj_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before rotary
    max_position_embeddings: int
    torch_dtype: Optional[torch.dtype]
    source: str = "<dict>"
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        """From a config.json, or from a checkpoint directory holding one."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ModelConfigError(f"{p}: no such config file (a checkpoint directory needs a config.json)")
        try:
            raw = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelConfigError(f"{p}: cannot be read as JSON ({e})") from e
        return cls.from_dict(raw, source=str(p))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "<dict>") -> "ModelConfig":
        if not isinstance(raw, dict):
            raise ModelConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        get = _Reader(raw, source)
        model_type = raw.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ModelConfigError(f"{source}: model_type {model_type!r} is not supported (supported: "
                                   f"{', '.join(MODEL_TYPES)})")
        _refuse_unsupported(raw, source)
        hidden, heads = get.integer("hidden_size"), get.integer("num_attention_heads")
        if "head_dim" not in raw and hidden % heads:
            raise ModelConfigError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads "
                                   f"{heads} and no head_dim is given")
        head_dim = get.integer("head_dim", hidden // heads)
        kv_heads = get.integer("num_key_value_heads", heads)
        if heads % kv_heads:
            raise ModelConfigError(f"{source}: num_attention_heads {heads} is not a multiple of "
                                   f"num_key_value_heads {kv_heads}")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling")  # transformers 5 / 4.x
        theta = (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 10000.0))
        # Qwen2 always has q/k/v biases (its config has no attention_bias key) and no o_proj bias.
        qkv_bias = True if model_type == "qwen2" else get.flag("attention_bias", False)
        return cls(
            model_type=model_type, vocab_size=get.integer("vocab_size"), hidden_size=hidden,
            intermediate_size=get.integer("intermediate_size"), num_hidden_layers=get.integer("num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=get.number("rms_norm_eps", 1e-6), rope_theta=float(theta),
            rope_scaling=dict(rope) if rope else None,
            tie_word_embeddings=get.flag("tie_word_embeddings", False), attention_bias=qkv_bias,
            o_proj_bias=qkv_bias if model_type != "qwen2" else False,
            mlp_bias=get.flag("mlp_bias", False) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3", max_position_embeddings=get.integer("max_position_embeddings", 2048),
            torch_dtype=get.dtype(), source=source, raw=dict(raw))

    @cached_property
    def hf_config(self) -> Any:
        """The transformers config object of the same dict: what `rope_cos_sin` reads, so the rope
        table follows HF's own rope-type code (llama3, yarn, linear) rather than a copy of it."""
        from transformers import AutoConfig
        kwargs = {k: v for k, v in self.raw.items() if k not in ("model_type", "transformers_version")}
        return AutoConfig.for_model(self.model_type, **kwargs)


def _refuse_unsupported(raw: dict, source: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if raw.get("use_sliding_window"):
        raise ModelConfigError(f"{source}: use_sliding_window=true is not supported (full causal attention only)")
    sliding = [i for i, t in enumerate(raw.get("layer_types") or []) if t != "full_attention"]
    if sliding:
        raise ModelConfigError(f"{source}: layer_types has non-full-attention layers {sliding[:8]}; "
                               f"only full causal attention is supported")
    if raw.get("quantization_config"):
        raise ModelConfigError(f"{source}: quantization_config is set; quantized checkpoints are not supported")


class _Reader:
    """Typed reads from the raw dict, each failure naming the file and the key."""

    def __init__(self, raw: dict, source: str) -> None:
        self.raw, self.source = raw, source

    def _get(self, key: str, default: Any) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is None:
                raise ModelConfigError(f"{self.source}: required key {key!r} is missing")
            return default
        return value

    def integer(self, key: str, default: Optional[int] = None) -> int:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ModelConfigError(f"{self.source}: {key} must be a positive integer, got {v!r}")
        return v

    def number(self, key: str, default: Optional[float] = None) -> float:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelConfigError(f"{self.source}: {key} must be a number, got {v!r}")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.raw.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ModelConfigError(f"{self.source}: {key} must be true or false, got {v!r}")
        return v

    def dtype(self) -> Optional[torch.dtype]:
        name = self.raw.get("dtype") or self.raw.get("torch_dtype")  # transformers 5 / 4.x
        if name is None:
            return None
        if name not in DTYPES:
            raise ModelConfigError(f"{self.source}: dtype {name!r} is not supported ({', '.join(DTYPES)})")
        return DTYPES[name]
