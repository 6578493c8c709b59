"""The command-line tools' check of `--device` (`python -m detent_rl.bench`, `python -m detent_rl.tune`), made
before any model loads or is written: one line naming the flag and what is wrong, not a traceback from deep in the
load (`--model`'s: `models.builtin.checkpoint_of`, then its config.json)."""
from __future__ import annotations

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
