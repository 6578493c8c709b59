"""Atomic files and directories: a reader sees the whole old thing or the whole new thing, never half.

Every writer in the project goes through here: the bytes go to a hidden temporary beside the target
(same filesystem, so the rename is atomic), are flushed and fsynced, the temporary is renamed onto
the target, and the parent directory is fsynced so the rename itself survives a power cut. A writer
killed part-way leaves only a hidden temporary, which nothing reads; `staged_dir` removes its own on
failure and `sweep` removes stale ones a killed process left. A directory that other processes fill
is split in two calls: `stage_dir` gives the temporary, `publish_dir` renames it into place;
`remove_dir` deletes a published directory the same all-or-nothing way.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file's bytes, or a directory's entries (a rename in it), by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """`with replacing(p) as f: f.write(...)`: `p` holds exactly what was written once the block ends
    without an exception; an exception leaves `p` as it was."""
    if mode not in ("w", "wb"):
        raise ValueError(f"replacing() writes whole files: mode 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=None if mode == "wb" else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a run's files from other users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with replacing(path) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with replacing(path, "wb") as f:
        f.write(data)
    return Path(path)


def stage_dir(path: str | os.PathLike) -> Path:
    """A new, empty hidden temporary directory beside `path`, for `publish_dir` to rename onto it.
    Writers in other processes may fill it; one that dies before publishing leaves it for `sweep`."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))


def publish_dir(tmp: str | os.PathLike, path: str | os.PathLike, *, replace: bool = False) -> Path:
    """Fsync every file in `tmp` (from `stage_dir(path)`) and rename it to `path`. With `replace`, an
    existing `path` is first renamed aside and removed after; without it, an existing `path` wins
    (another process published the same thing first) and `tmp` is dropped. `tmp` is used up either
    way: renamed, or removed if anything fails."""
    tmp, final, old = Path(tmp), Path(path), None
    try:
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_path(f)
        os.chmod(tmp, 0o755)
        old = _set_aside(final) if replace else None
        try:
            os.rename(tmp, final)
        except OSError:
            if replace or not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # lost a race to an equal copy
        fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if replace and old is not None and not final.exists():
            os.rename(old, final)  # put back what was there
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """`with staged_dir(final) as tmp: <write files into tmp>`: `stage_dir` then `publish_dir` once the
    block ends without an exception; an exception removes `tmp` and leaves `final` as it was."""
    tmp = stage_dir(path)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, path, replace=replace)


def remove_dir(path: str | os.PathLike) -> None:
    """Remove directory `path` as a reader sees it, at once: it is renamed to a hidden temporary
    (atomic) and deleted from there, so a kill part-way leaves a temporary for `sweep`, never a
    half-deleted `path`. A missing `path` is no error."""
    aside = _set_aside(Path(path))
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _set_aside(path: Path) -> Path | None:
    """Rename an existing `path` to a fresh hidden temporary beside it (what `sweep` removes)."""
    if not path.exists():
        return None
    aside = stage_dir(path)
    os.rename(path, aside)  # onto the empty directory mkdtemp made
    fsync_path(path.parent)
    return aside


def sweep(directory: str | os.PathLike, name: str) -> None:
    """Remove the hidden temporaries that a killed writer of `directory/name` left behind (`name` may
    be a glob pattern: `sweep(d, "step_*")`). Only for temporaries no live writer still uses."""
    for stale in Path(directory).glob(f".{name}.*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
