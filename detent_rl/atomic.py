"""Atomic files and directories: a reader sees the whole old thing or the whole new thing, never half.

Every writer in the project goes through here: the bytes go to a hidden temporary beside the target
(same filesystem, so the rename is atomic), are flushed and fsynced, the temporary is renamed onto
the target, and the parent directory is fsynced so the rename itself survives a power cut. A writer
killed part-way leaves only a hidden temporary, which nothing reads; `staged_dir` removes its own on
failure and `sweep` removes stale ones a killed process left.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator


def fsync_dir(path: str | os.PathLike) -> None:
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
    fsync_dir(path.parent)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with replacing(path) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with replacing(path, "wb") as f:
        f.write(data)
    return Path(path)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """`with staged_dir(final) as tmp: <write files into tmp>`: then every file in it is fsynced and
    `tmp` is renamed to `final`. With `replace`, an existing `final` is removed first; without it, an
    existing `final` wins (another process published the same thing first) and `tmp` is dropped."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        os.chmod(tmp, 0o755)
        if final.exists() and replace:
            shutil.rmtree(final)
        try:
            os.rename(tmp, final)
        except OSError:
            if replace or not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # lost a race to an equal copy
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sweep(directory: str | os.PathLike, name: str) -> None:
    """Remove the hidden temporaries that a killed writer of `directory/name` left behind."""
    for stale in Path(directory).glob(f".{name}.*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
