"""Run checkpoints: `<run>/checkpoints/step_NNNNNN/`, a directory of parts and a manifest.

Each part is written by the process that holds its state, straight from that state — the trainer
worker streams its fp32 masters and AdamW state from the live tensors (`Trainer.save_state`), the
driver writes its small part (the prompt sampler's position) — into a hidden staging directory,
which is then published in one rename:

    staged = checkpoint.stage(run_dir, step)                 # <run>/checkpoints/.step_NNNNNN.*.tmp
    trainer.save_state(staged / checkpoint.TRAINER_PART)     # in the trainer worker's process
    checkpoint.save_part(staged, checkpoint.DRIVER_PART, {"sampler": sampler.state_dict()})
    checkpoint.publish(run_dir, step, staged, keep=2)        # -> <run>/checkpoints/step_NNNNNN

`publish` hashes every part into `manifest.json` (format 2: the step and each file's size and
sha256), fsyncs, renames the directory into place (`detent_rl.atomic`) and keeps the newest `keep`
checkpoints (none of a later step: a run resumed from an earlier checkpoint leaves those behind).
A run killed before `publish` leaves only its staging directory, which nothing reads and the next
`stage` removes; a checkpoint is there whole or not at all.

Resuming is two steps, so that the hashing (seconds for a GB-sized checkpoint) happens before any
worker or model is started:

    path = checkpoint.resume_point(run_dir)            # or a checkpoint directory: verified, else one line
    step = checkpoint.step_of(path)
    trainer.load_state(path / checkpoint.TRAINER_PART)  # in the trainer worker: mmap, copied into live tensors
    driver = checkpoint.load_part(path, checkpoint.DRIVER_PART)

`resume_point` re-hashes every file against the manifest. A checkpoint missing a file, truncated,
altered or with an unreadable manifest is refused (`CheckpointCorrupt`, one line naming the file and
what is wrong, and the newest checkpoint of the same run that is intact, to resume from with
`--resume PATH`); nothing is loaded from it. No checkpoint at all is `NoCheckpoint`. Both are
`CheckpointError`, the one class a driver catches.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Optional

import torch

from detent_rl import atomic

FORMAT = 2  # 1: one state.pt built by the driver; 2: parts written by their owners
MANIFEST = "manifest.json"
TRAINER_PART = "trainer.pt"  # written by `Trainer.save_state` in the trainer worker
DRIVER_PART = "driver.pt"  # written by the driver with `save_part`
_NAME = re.compile(r"^step_(\d{6,})$")


class CheckpointError(RuntimeError):
    """There is no checkpoint to resume from here; the message (one line) says why and what to do."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint that fails its manifest check; the message names the directory and the file."""


class NoCheckpoint(CheckpointError):
    """The path is neither a checkpoint nor a run directory holding one."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _dir_name(step: int) -> str:
    return f"step_{step:06d}"


# ---- writing -----------------------------------------------------------------------------------
def stage(run_dir: str | Path, step: int) -> Path:
    """An empty hidden directory for the parts of `step`'s checkpoint (beside the published ones, so
    `publish` is a rename); staging directories a killed run left are removed first."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    atomic.sweep(root, "step_*")
    return atomic.stage_dir(root / _dir_name(step))


def save_part(staged: str | Path, name: str, obj: Any) -> Path:
    """Write `obj` (anything `torch.save` takes and `torch.load(weights_only=True)` reads back) as part
    `name` of a staged checkpoint."""
    if name == MANIFEST or Path(name).name != name:
        raise ValueError(f"a part is a plain file name other than {MANIFEST}, got {name!r}")
    path = Path(staged) / name
    torch.save(obj, path)
    return path


def publish(run_dir: str | Path, step: int, staged: str | Path, keep: int = 2) -> Path:
    """Hash the parts in `staged` into its manifest and make it `<run>/checkpoints/step_NNNNNN`
    (replacing one of the same step: a resumed run passing it again); then keep the newest `keep`
    (0: all). Checkpoints of later steps are removed: they belong to the trajectory this run left
    when it resumed from an earlier one (as its logs, truncated at the resume step, do). Returns
    the checkpoint's path."""
    root, staged = Path(run_dir) / "checkpoints", Path(staged)
    if staged.parent.resolve() != root.resolve() or not staged.name.startswith(f".{_dir_name(step)}."):
        raise ValueError(f"{staged} is not a staging directory of step {step} in {root} (see checkpoint.stage)")
    parts = sorted(p for p in staged.rglob("*") if p.is_file() and p.name != MANIFEST)
    if not parts:
        raise ValueError(f"{staged} holds no parts to publish")
    files = {p.relative_to(staged).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in parts}
    (staged / MANIFEST).write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1,
                                              sort_keys=True))
    final = atomic.publish_dir(staged, root / _dir_name(step), replace=True)
    steps = sorted(_steps(root))
    later = [s for s in steps if s > step]  # from the run this one resumed before their step, left behind
    older = [s for s in steps if s <= step]
    for s in later + (older[:-keep] if keep > 0 else []):
        atomic.remove_dir(root / _dir_name(s))
    return final


# ---- reading -----------------------------------------------------------------------------------
def _steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return [int(m.group(1)) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]


def latest(run_dir: str | Path) -> Optional[Path]:
    """The run's highest-step checkpoint directory, unverified; None if it has none."""
    root = Path(run_dir) / "checkpoints"
    steps = sorted(_steps(root))
    return root / _dir_name(steps[-1]) if steps else None


def _manifest(path: Path) -> dict:
    try:
        meta = json.loads((path / MANIFEST).read_text())
        files, step = meta["files"], meta["step"]
        if not isinstance(step, int) or not isinstance(files, dict) or not all(
                isinstance(w, dict) and isinstance(w.get("bytes"), int) and isinstance(w.get("sha256"), str)
                for w in files.values()):
            raise TypeError("it needs an integer step and files of {name: {bytes, sha256}}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointCorrupt(f"checkpoint {path}: unreadable {MANIFEST} ({e}); it is not loaded") from None
    if meta.get("format") != FORMAT:
        raise CheckpointCorrupt(f"checkpoint {path}: format {meta.get('format')!r} (written by another version of "
                                f"detent_rl), this version reads {FORMAT}; it is not loaded")
    return meta


def verify(path: str | Path) -> dict:
    """The manifest of a checkpoint directory whose files all match it; CheckpointCorrupt otherwise."""
    path = Path(path)
    meta = _manifest(path)
    for name, want in sorted(meta["files"].items()):
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
    m = _NAME.match(path.name)
    if m and int(m.group(1)) != meta["step"]:
        raise CheckpointCorrupt(f"checkpoint {path}: its manifest says step {meta['step']}; it is not loaded")
    return meta


def _newest_intact(root: Path, but: Path) -> str:
    """The sentence pointing at the newest checkpoint in `root` other than `but` that verifies."""
    others = [root / _dir_name(s) for s in sorted(_steps(root), reverse=True) if _dir_name(s) != but.name]
    for other in others:
        try:
            verify(other)
        except CheckpointCorrupt:
            continue
        return f"The newest intact checkpoint is {other}: resume from it with --resume {other}"
    return f"No other checkpoint in {root} is intact" if others else f"{root} holds no other checkpoint"


def resume_point(target: str | Path) -> Path:
    """The verified checkpoint to resume from: a run directory's newest, or the checkpoint directory
    `target` itself. Hashes every file (nothing is loaded); call it before starting any worker.
    CheckpointCorrupt (naming the newest intact checkpoint) or NoCheckpoint otherwise."""
    target = Path(target)
    if (target / MANIFEST).exists() or _NAME.match(target.name):
        path = target
    elif not target.is_dir():
        raise NoCheckpoint(f"{target}: no such directory, so no checkpoint to resume from")
    else:
        path = latest(target)
        if path is None:
            raise NoCheckpoint(f"{target} has no checkpoint to resume from (no {target / 'checkpoints'}/step_NNNNNN; "
                               f"is it the run directory, with checkpoint.every > 0?)")
    if not path.is_dir():
        raise NoCheckpoint(f"{path}: no such checkpoint directory")
    try:
        verify(path)
    except CheckpointCorrupt as e:
        raise CheckpointCorrupt(f"{e}. {_newest_intact(path.parent, path)}") from None
    return path


def step_of(path: str | Path) -> int:
    """The step a checkpoint was saved at (from its manifest)."""
    return _manifest(Path(path))["step"]


def load_part(path: str | Path, name: str) -> Any:
    """Part `name` of checkpoint `path` (verified by `resume_point`; here only its size is checked).
    Tensors in it are memory-mapped from the file, copy-on-write: copy what is kept long."""
    path = Path(path)
    files = _manifest(path)["files"]
    if name not in files:
        raise CheckpointCorrupt(f"checkpoint {path} has no part {name} (its parts: {', '.join(sorted(files))})")
    f = path / name
    if not f.is_file() or f.stat().st_size != files[name]["bytes"]:
        raise CheckpointCorrupt(f"checkpoint {path}: {name} is missing or changed since it was verified; "
                                f"it is not loaded")
    return torch.load(f, map_location="cpu", mmap=True, weights_only=True)
