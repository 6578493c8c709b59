"""The command-line tools' checks of their common arguments (`python -m detent_rl.bench`, `python -m detent_rl.tune`),
made before any model loads or is written: one line naming the flag and what is wrong, not a traceback from deep in
the load."""
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


def checkpoint_arg(model: str) -> Path:
    """`--model`'s checkpoint directory: a built-in's (made once in the models cache), or a directory holding a
    config.json (ValueError otherwise, naming it and the built-ins)."""
    from detent_rl.models.builtin import NAMES, builtin_checkpoint
    if model in NAMES:
        return builtin_checkpoint(model)
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(f"--model {model}: neither a built-in model ({', '.join(NAMES)}) nor a checkpoint directory "
                         f"(no config.json there)")
    return path
