"""Test helpers: random SelIR programs, loading programs from source, and an independent graph
interpreter (it shares only the per-op semantics with the code under test, not the code generator)."""
from __future__ import annotations

import importlib.util
import itertools
import random
import sys
from pathlib import Path
from typing import Any

from detent_rl.selir import ops
from detent_rl.selir.graph import Node

_counter = itertools.count()

HEADER = """\
from detent_rl.selir import Fact, Request, Runtime, Unpinnable, assume, ceil, knob, nearest_key, record, \
require, selection

@record
class Row:
    a: int
    b: int

TABLE = {1: Row(a=3, b=-2), 4: Row(a=7, b=5), 9: Row(a=-4, b=11), 16: Row(a=0, b=2)}
"""


def load_module(source: str, tmp_path: Path, name: str | None = None) -> Any:
    """Write `source` to a real file (SelIR reads programs' source) and import it."""
    name = name or f"selir_prog_{next(_counter)}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class RandomProgram:
    """A random program over x: Runtime[int], y: Unpinnable[int], flag: Runtime[bool], f: Fact[int]."""

    INPUTS = {"x": (-6, 40), "y": (0, 25)}

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.names = ["x", "y", "f"]
        self.lines: list[str] = []
        self.n = 0

    def atom(self) -> str:
        r = self.r
        if r.random() < 0.3:
            return str(r.randint(-3, 9))
        return r.choice(self.names + ["k"])

    def expr(self, depth: int = 0) -> str:
        r = self.r
        if depth >= 3 or r.random() < 0.25:
            return self.atom()
        a, b = self.expr(depth + 1), self.expr(depth + 1)
        kind = r.randrange(10)
        if kind < 4:
            return f"({a} {r.choice(['+', '-', '*', '//', '%'])} {b})"
        if kind == 4:
            return f"{r.choice(['min', 'max'])}({a}, {b})"
        if kind == 5:
            return f"({a} if {self.cond(depth + 1)} else {b})"
        if kind == 6:
            return f"TABLE[nearest_key(TABLE, {a})].{r.choice('ab')}"
        if kind == 7:
            return f"abs({a})"
        if kind == 8:
            return f"({a} if flag else {b})"
        return f"({a} * 2 + {b})"

    def cond(self, depth: int = 0) -> str:
        r = self.r
        c = f"{self.expr(depth + 1)} {r.choice(['<', '<=', '>', '>=', '==', '!='])} {self.expr(depth + 1)}"
        if r.random() < 0.3:
            c = f"({c}) {r.choice(['and', 'or'])} ({self.expr(depth + 1)} < {r.randint(-5, 30)})"
        if r.random() < 0.15:
            c = f"not ({c})"
        return c

    def block(self, indent: str, depth: int) -> None:
        r = self.r
        for _ in range(r.randint(1, 4)):
            kind = r.randrange(8)
            if kind < 4 or depth > 1:
                v = f"v{self.n}"
                self.n += 1
                self.lines.append(f"{indent}{v} = {self.expr()}")
                self.names.append(v)
            elif kind == 4:
                v = f"v{self.n}"
                self.n += 1
                self.lines.append(f"{indent}{v} = 0")
                self.lines.append(f"{indent}if {self.cond()}:")
                self.lines.append(f"{indent}    {v} = {self.expr()}")
                self.lines.append(f"{indent}else:")
                self.lines.append(f"{indent}    {v} = {self.expr()}")
                self.names.append(v)
            elif kind == 5:
                self.lines.append(f"{indent}if {self.cond()}:")
                self.lines.append(f"{indent}    return {self.result()}")
            elif kind == 6:
                v = f"v{self.n}"
                self.n += 1
                self.lines.append(f"{indent}{v} = 0")
                self.lines.append(f"{indent}for i in (1, 2, 3):")
                self.lines.append(f"{indent}    if {self.cond()}:")
                self.lines.append(f"{indent}        {v} = {v} + i")
                self.names.append(v)
            else:
                self.lines.append(f"{indent}require({self.cond()})")

    def result(self) -> str:
        if not hasattr(self, "points"):
            self.points = self.r.randint(1, 3)  # every return gives the same selection points
        return "{" + ", ".join(f'"p{i}": ({self.expr()}) + {i + 1}' for i in range(self.points)) + "}"

    def source(self) -> str:
        (xlo, xhi), (ylo, yhi) = self.INPUTS["x"], self.INPUTS["y"]
        self.lines = [
            "@selection",
            "def prog(x: Runtime[int], y: Unpinnable[int], flag: Runtime[bool], f: Fact[int]):",
            f"    assume({xlo} <= x <= {xhi})",
            f"    assume({ylo} <= y <= {yhi})",
            "    k = knob('k', (0, 2, 5), 2)",
        ]
        self.block("    ", 0)
        self.lines.append(f"    return {self.result()}")
        return HEADER + "\n" + "\n".join(self.lines) + "\n"


class Failed(Exception):
    """A require/assume failed, or Python raised, in the plain-Python run."""


def run_python(mod: Any, knobs: dict, **inputs: Any) -> Any:
    """Run the program's original function under CPython (the semantics SelIR promises)."""
    import types

    def require(cond: Any, msg: str = "") -> None:
        if not cond:
            raise Failed(msg)

    g = dict(mod.prog.fn.__globals__)
    g.update(require=require, assume=require, knob=lambda name, choices, default: knobs.get(name, default))
    fn = types.FunctionType(mod.prog.fn.__code__, g)
    try:
        return fn(**inputs)
    except (Failed, ZeroDivisionError, KeyError) as e:
        return Failed(type(e).__name__)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def eval_graph(roots: list, inputs: dict, knobs: dict, pins: dict[int, Any]) -> list:
    """Interpret graph nodes directly (pins by node id), independently of the code generator."""
    memo: dict[int, Any] = {}

    def ev(v: Any) -> Any:
        if not isinstance(v, Node):
            return v
        if v.id in pins:
            return pins[v.id]
        if v.id not in memo:
            if v.op == "input":
                memo[v.id] = inputs[v.aux[0]]
            elif v.op == "knob":
                memo[v.id] = knobs[v.aux[0]]
            else:
                memo[v.id] = ops.apply(v.op, tuple(ev(a) for a in v.args), v.aux)
        return memo[v.id]

    return [ev(r) for r in roots]
