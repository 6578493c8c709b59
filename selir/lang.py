"""The surface of SelIR that selection programs import: input kinds, knobs, checks, records.

Programs are plain Python functions decorated with `@selection` (`parse.py`, re-exported with
these names by `detent_rl.selir`). Their bodies are never run by CPython: `@selection` parses them
(and rejects anything outside the subset), and every evaluation goes through the compiler, so a
program means the same thing to the solver and to the engine. The parser recognises the calls below
by identity; this module sits at the bottom of SelIR's imports (only `ops` below it).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Generic, TypeVar

from detent_rl.selir.ops import to_float32

T = TypeVar("T")

INPUT_KINDS = ("Runtime", "Unpinnable", "Request", "Fact")


class Runtime(Generic[T]):
    """A batch-dependent input the solver may pin (e.g. the batch's token count)."""


class Unpinnable(Generic[T]):
    """A batch-dependent input that must never be pinned (e.g. the longest KV length in the batch)."""


class Request(Generic[T]):
    """One request's own value, read per request (e.g. its own KV length): not batch-dependent, since no
    other request changes it, and never pinned. A selection that reads only Request inputs and facts
    is batch-invariant as it stands."""


class Fact(Generic[T]):
    """A deployment fact known before serving (head dim, SM count, TP degree, page size, ...)."""


def _outside(name: str) -> RuntimeError:
    return RuntimeError(f"SelIR's {name}() only has meaning inside an @selection program")


def knob(name: str, choices: tuple, default: Any) -> Any:
    """Declare a deployment setting that no input determines (part of the commitment tuple)."""
    raise _outside("knob")


def require(cond: bool, message: str = "") -> None:
    """State a precondition of the selected kernel; a violating selection never runs."""
    raise _outside("require")


def assume(cond: bool, message: str = "") -> None:
    """State an assumption about the inputs; the solver may simplify with it, the selector checks it."""
    raise _outside("assume")


def nearest_key(table: dict, key: float) -> Any:
    """The key of `table` nearest to `key`; ties go to the earlier key in table order."""
    return min(table.keys(), key=lambda k: abs(k - key))


def ceil(x: float) -> int:
    """`math.ceil`, allowed inside programs."""
    return math.ceil(x)


def float32(x: float) -> float:
    """`x` rounded to the nearest float32 (ties to even), for transcribing float32 host code."""
    return to_float32(x)


def record(cls: type) -> type:
    """A frozen record usable as a value and as a table row inside selection programs."""
    out = dataclasses.dataclass(frozen=True)(cls)
    out.__selir_record__ = True
    return out


def is_record_type(obj: Any) -> bool:
    return isinstance(obj, type) and obj.__dict__.get("__selir_record__", False) is True


def is_record(value: Any) -> bool:
    return is_record_type(type(value))
