"""The command-line tools' checks of `--device` and `--model` (`python -m detent_rl.bench`, `python -m
detent_rl.tune`), made before any model loads or is written: one line naming the flag and what is wrong, not a
traceback from deep in the load."""
from __future__ import annotations

from pathlib import Path

import torch


def device_arg(device: str) -> None:
    """Refuse a `--device` the tools cannot run on here (ValueError, naming it)."""
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"--device {device!r}: not a device ({e})") from None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the tools run on cpu or cuda")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is available")


def model_on_device(model: str, device: str) -> Path:
    """`--model`'s checkpoint directory (`models.builtin.checkpoint_of`, its config.json read) after `device_arg`
    (ValueError naming the flag otherwise)."""
    from detent_rl.models.builtin import checkpoint_of
    from detent_rl.models.config import ModelConfig
    device_arg(device)
    try:  # a directory that is not one, or whose config.json this model code cannot take
        path = checkpoint_of(model)
        ModelConfig.from_file(path)
    except ValueError as e:
        raise ValueError(f"--model: {e}") from None
    return path
