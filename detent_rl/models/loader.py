"""Build a CausalLM from an HF checkpoint directory: config.json plus safetensors (single or sharded).

Each checkpoint tensor is routed to the parameter of the same name, or — for projections we fuse —
to a shard of the fused parameter (q/k/v -> qkv_proj, gate/up -> gate_up_proj), through that
parameter's own `weight_loader`. Every tensor must find a parameter and every parameter (each
shard of a fused one) must be loaded; otherwise one error lists all the names at fault.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional

import torch
from safetensors import safe_open

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.kernels.selections import KernelSelections
from detent_rl.models.config import ModelConfig
from detent_rl.models.layers import Device, copy_weight
from detent_rl.models.model import CausalLM, deployment_for
from detent_rl.models.parallel import TensorParallel

# HF projection name -> (our fused parameter's module, shard id)
FUSED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
         "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}
UNFUSED = {v: k for k, v in FUSED.items()}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved


class WeightsError(ValueError):
    """Weight files that do not match the model built from their config; names the files and tensors."""


def load_model(path: str | Path, selections: KernelSelections | str = "detent", device: Device = "cpu",
               dtype: Optional[torch.dtype] = None, *, commitment: Optional[CommitmentTuple] = None,
               page_size: int = 16, max_context: int = 4096, max_batch: int = 256,
               max_num_tokens: int = 8192, tp: Optional[TensorParallel] = None) -> CausalLM:
    """The model of checkpoint directory `path`, its weights loaded.

    `selections` is a built KernelSelections, or an arm name ("detent", "det", "stock") to build one
    for this model with the given deployment limits and, for the detent arm, `commitment` (a loaded
    tuple file: it must record this deployment and only sites this model has, or CommitmentError).
    `dtype` defaults to the config's dtype (fp32 if it names none). With `tp` (models/parallel.py)
    the model is this rank's part and each parameter loads its part of the checkpoint's tensor.
    """
    root = Path(path)
    config = ModelConfig.from_file(root)
    dtype = dtype or config.torch_dtype or torch.float32
    if isinstance(selections, str):
        deployment = deployment_for(config, dtype, page_size=page_size, max_context=max_context,
                                    max_batch=max_batch, max_num_tokens=max_num_tokens,
                                    tp_size=tp.size if tp is not None else 1)
        selections = KernelSelections(deployment, selections, commitment)
    elif commitment is not None:  # the built selections have their own tuple (or none); this one would be ignored
        raise ValueError("load_model: give `commitment` with an arm name, not with built KernelSelections "
                         "(pass the tuple to KernelSelections instead)")
    model = CausalLM(config, selections, device, dtype, tp=tp)
    if model.device.type != "meta":  # on "meta": the model's shapes and selections alone, e.g. to check a tuple
        load_weights(model, root)
    return model


def checkpoint_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, from its shard index when it has one."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise WeightsError(f"{index}: not a safetensors index with a 'weight_map' ({e!r})") from e
        files = [root / name for name in sorted(set(weight_map.values()))]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise WeightsError(f"{index}: lists shards that do not exist: {absent}")
        return files
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    raise WeightsError(f"{root}: no model.safetensors or model.safetensors.index.json")


def _tensors(files: list[Path]) -> Iterator[tuple[str, str, Callable[[], torch.Tensor]]]:
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield str(file), name, lambda f=f, name=name: f.get_tensor(name)


def load_weights(model: CausalLM, root: Path) -> None:
    """Load every tensor of the checkpoint at `root` into `model` via the parameters' weight_loaders."""
    load_named(model, _tensors(checkpoint_files(root)), f"checkpoint {root}")


def update_weights(model: CausalLM, weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
                   *, strict: bool = True) -> int:
    """Copy new values into the model's parameters in place (HF names, or ours for fused projections);
    with `strict` every parameter must be given. Returns how many parameters (fused shards) were set."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    return load_named(model, (("update_weights", name, lambda t=t: t) for name, t in items), "update_weights",
                      strict=strict)


def load_named(model: CausalLM, tensors: Iterable[tuple[str, str, Callable[[], torch.Tensor]]], source: str,
               *, strict: bool = True) -> int:
    """Route (origin, name, get) tensors to parameters; one error lists every name at fault."""
    params = dict(model.named_parameters())  # a tied lm_head shares embed_tokens' entry
    expected = {(name, shard) for name, p in params.items() for shard in getattr(p, "shard_ids", (None,))}
    loaded, unexpected = set(), []
    for origin, hf_name, get in tensors:
        if hf_name.endswith(IGNORED_SUFFIXES):
            continue
        if hf_name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # tied: HF ignores a saved copy too, the embedding is the head
        name, shard = _our_name(hf_name)
        param = params.get(name)
        if param is None or (shard is not None and not hasattr(param, "shard_ids")):
            unexpected.append(hf_name)
            continue
        try:
            if shard is None and hasattr(param, "shard_ids"):  # a fused parameter under our own name
                copy_weight(param, get().to(param.device))
                loaded.update((name, s) for s in param.shard_ids)
                continue
            if shard is None:
                param.weight_loader(param, get().to(param.device))
            else:
                param.weight_loader(param, get().to(param.device), shard)
        except ValueError as e:
            raise WeightsError(f"{origin}: tensor {hf_name}: {e}") from e
        loaded.add((name, shard))
    missing = sorted(checkpoint_name(name, shard) for name, shard in expected - loaded) if strict else []
    if missing or unexpected:
        parts = [f"missing tensors {missing}"] if missing else []
        parts += [f"unexpected tensors {sorted(unexpected)}"] if unexpected else []
        raise WeightsError(f"{source} does not match the model's config "
                              f"({model.config.model_type}): {'; '.join(parts)}")
    return len(loaded)


def _our_name(hf_name: str) -> tuple[str, Optional[str]]:
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        module, shard = FUSED[parts[-2]]
        return ".".join(parts[:-2] + [module, parts[-1]]), shard
    return hf_name, None


def checkpoint_name(name: str, shard: Optional[str]) -> str:
    """The checkpoint's name of our parameter `name` (of its `shard` where it is fused)."""
    if shard is None:
        return name
    parts = name.split(".")
    return ".".join(parts[:-2] + [UNFUSED[(parts[-2], shard)], parts[-1]])
