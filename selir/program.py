"""A parsed selection program: its parameters, its body and a canonical text for hashing.

`@selection` (`parse.py`) makes Programs; calling one evaluates it through `specialize.py`.
"""
from __future__ import annotations

import hashlib
from dataclasses import fields, is_dataclass
from typing import Any, Callable

from detent_rl.selir import syntax as S
from detent_rl.selir.lang import is_record, is_record_type
from detent_rl.selir.specialize import evaluate


def canonical(value: Any) -> str:
    """A stable text for a static value (tables, records, syntax trees) used in hashes."""
    if isinstance(value, Program):
        return f"Program({value.qualname}:{value.digest})"
    if is_record_type(value):
        return f"record {value.__module__}.{value.__qualname__}({','.join(f.name for f in fields(value))})"
    if is_record(value) or (is_dataclass(value) and not isinstance(value, type)):
        inner = ",".join(f"{f.name}={canonical(getattr(value, f.name))}" for f in fields(value))
        return f"{type(value).__name__}({inner})"
    if isinstance(value, dict):
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(canonical(v) for v in value) + ",)"
    if isinstance(value, float):
        return value.hex()
    return repr(value)


class Program:
    """A `@selection` function, parsed. Calling it evaluates it (all inputs given, knobs by name)."""

    def __init__(self, name: str, qualname: str, file: str, line: int,
                 params: tuple[S.Param, ...], body: tuple[S.Stmt, ...], fn: Callable | None = None,
                 schedule: tuple[str, ...] = ()) -> None:
        self.name = name
        # returned values declared bit-neutral: launch parameters (tile shape, warps, grid) that may
        # follow the batch because no row's result depends on them; the cut leaves them unpinned
        self.schedule = tuple(schedule)
        self.qualname = qualname
        self.file = file
        self.line = line
        self.params = params
        self.body = body
        self.fn = fn
        self.digest = hashlib.sha256(canonical(body).encode() + canonical(params).encode()
                                     + canonical(self.schedule).encode()).hexdigest()[:16]

    def is_schedule(self, point: str) -> bool:
        """Whether selection point `point` (a flattened name, `tile.block_m`) is declared bit-neutral."""
        return any(point == s or point.startswith((s + ".", s + "[")) for s in self.schedule)

    def inputs(self, kind: str) -> tuple[S.Param, ...]:
        return tuple(p for p in self.params if p.kind == kind)

    @property
    def batch_inputs(self) -> tuple[S.Param, ...]:
        return tuple(p for p in self.params if p.kind != "Fact")

    def __call__(self, knobs: dict | None = None, **values: Any) -> Any:
        """Evaluate with every input given: the reference semantics the compiled selectors must match."""
        return evaluate(self, values, knobs or {})

    def __repr__(self) -> str:
        return f"<selection {self.qualname} at {self.file}:{self.line}>"
