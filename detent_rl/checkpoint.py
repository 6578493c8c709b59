"""Atomic, verified run checkpoints: `<run>/checkpoints/step_NNNNNN/{state.pt, manifest.json}`.

Writing: everything goes into a hidden temporary directory beside the final one, each file is
fsynced, then the directory is renamed into place (a rename is atomic on one filesystem), so a
SIGKILL leaves either the whole checkpoint or none (a leftover temporary directory is never read
and is removed by the next save). The manifest records the step and each file's size and sha256.

Reading: `latest` picks the highest step; `load` re-hashes every file against the manifest and
refuses — naming the file and what is wrong — a checkpoint that is missing a file, truncated or
altered. Nothing is loaded from a checkpoint that fails the check.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

FORMAT = 1
_NAME = re.compile(r"^step_(\d{6,})$")


class CheckpointCorrupt(RuntimeError):
    """A checkpoint that fails its manifest check; the message names the directory and the file."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` (anything torch.save takes) as the checkpoint of `step`; keep the newest `keep`."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step_*.tmp*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp{os.getpid()}"
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    with open(tmp / "state.pt", "rb+") as f:
        os.fsync(f.fileno())
    files = {"state.pt": {"bytes": (tmp / "state.pt").stat().st_size, "sha256": _sha256(tmp / "state.pt")}}
    manifest = tmp / "manifest.json"
    manifest.write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1, sort_keys=True))
    with open(manifest, "rb+") as f:
        os.fsync(f.fileno())
    if final.exists():  # a re-save of the same step (a resumed run passing it again)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    if keep > 0:
        for old in sorted(_steps(root))[:-keep]:
            shutil.rmtree(root / f"step_{old:06d}", ignore_errors=True)
    return final


def _steps(root: Path) -> list[int]:
    return [int(m.group(1)) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]


def latest(run_dir: str | Path) -> Optional[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    steps = sorted(_steps(root))
    return root / f"step_{steps[-1]:06d}" if steps else None


def verify(path: str | Path) -> dict:
    """The manifest of a checkpoint directory whose files all match it; CheckpointCorrupt otherwise."""
    path = Path(path)
    manifest = path / "manifest.json"
    try:
        meta = json.loads(manifest.read_text())
        files, step = meta["files"], meta["step"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointCorrupt(f"checkpoint {path}: unreadable manifest.json ({e}); it is not loaded") from e
    if meta.get("format") != FORMAT:
        raise CheckpointCorrupt(f"checkpoint {path}: format {meta.get('format')!r}, this version reads {FORMAT}")
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointCorrupt(f"checkpoint {path}: {name} is missing; it is not loaded")
        size = f.stat().st_size
        if size != want["bytes"]:
            raise CheckpointCorrupt(f"checkpoint {path}: {name} has {size} bytes, the manifest says "
                                    f"{want['bytes']} (partial write?); it is not loaded")
        if _sha256(f) != want["sha256"]:
            raise CheckpointCorrupt(f"checkpoint {path}: {name} does not match its sha256 in the manifest; "
                                    f"it is not loaded")
    if _NAME.match(path.name) and int(_NAME.match(path.name).group(1)) != step:
        raise CheckpointCorrupt(f"checkpoint {path}: its manifest says step {step}")
    return meta


def load(path: str | Path) -> tuple[int, dict[str, Any]]:
    """(step, state) of a verified checkpoint."""
    meta = verify(path)
    state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=True)
    return meta["step"], state
