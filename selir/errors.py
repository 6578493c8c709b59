"""Errors raised by SelIR, each naming where in the user's program the problem lies."""
from __future__ import annotations


class SelIRError(Exception):
    """A selection program is outside the SelIR subset or cannot be solved."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        self.file = file
        self.line = line
        where = f"{file}:{line}: " if file is not None and line is not None else ""
        super().__init__(f"{where}{message}")


class SelectionError(RuntimeError):
    """A runtime selection violated a `require`/`assume`; no kernel may run with it."""
