"""Python source for a slice of the dependence graph (used by compiled selectors and VRA checks).

Each node becomes one line `v<id> = <expr>` in topological order. Pinned nodes and knobs become
literal constants, and everything only they read is dropped, so a pinned selector computes only
what its conditions and unpinned selection points still need.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from detent_rl.selir import ops
from detent_rl.selir.graph import Node
from detent_rl.selir.lower import reachable

RUNTIME_HELPERS = {"_fdiv": ops.fdiv, "_tdiv": ops.tdiv, "_mod": ops.mod, "_pow": ops.power,
                   "_ceil": ops.ceil, "_trunc": ops.trunc, "_nearest": ops.nearest, "_f32": ops.to_float32}


def lit(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    if isinstance(v, tuple):
        return "(" + "".join(lit(x) + ", " for x in v) + ")"
    if v is None or isinstance(v, (bool, int, float, str)):
        return repr(v)
    raise TypeError(f"cannot emit constant {v!r}")


def operand(a: Any) -> str:
    if isinstance(a, Node):
        return a.aux[0] if a.op == "input" else f"v{a.id}"
    return lit(a)


class Emitter:
    """Collects the lines and module-level tables of one generated function."""

    def __init__(self, pinned: dict[int, str], knobs: dict[str, str],
                 values: dict[int, Any] | None = None, knob_values: dict[str, Any] | None = None) -> None:
        # pinned: node id -> code for its value; knobs: name -> code (literals or parameter names).
        # values/knob_values, when given, are the constants themselves: what only they feed folds.
        self.pinned = pinned
        self.knobs = knobs
        self.known: dict[int, Any] = dict(values or {})
        self.knob_values = dict(knob_values or {})
        self.tables: dict[str, str] = {}  # global name -> source of a constant table

    def table(self, prefix: str, src: str) -> str:
        for name, s in self.tables.items():
            if s == src:
                return name
        name = f"_{prefix}{len(self.tables)}"
        self.tables[name] = src
        return name

    def slice(self, roots: Iterable[Any]) -> list[Node]:
        """Nodes the roots need, stopping at pinned nodes and knobs, in topological order."""
        need = reachable(list(roots), stop=lambda n: n.id in self.pinned or n.op == "knob")
        return sorted(need.values(), key=lambda n: n.id)

    def expr(self, n: Node) -> str:
        if n.id in self.pinned:
            return self.pinned[n.id]
        a = [self.operand(x) for x in n.args]
        op = n.op
        if op == "input":
            return n.aux[0]
        if op == "knob":
            return self.knobs[n.aux[0]]
        if op in ("add", "sub", "mul") or op in ops.COMPARISONS:
            return f"({a[0]} {ops.SYMBOL[op]} {a[1]})"
        if op in ("truediv", "floordiv", "mod", "pow"):
            return f"{ {'truediv': '_tdiv', 'floordiv': '_fdiv', 'mod': '_mod', 'pow': '_pow'}[op]}({a[0]}, {a[1]})"
        if op == "min":
            return f"({a[0]} if {a[0]} <= {a[1]} else {a[1]})"
        if op == "max":
            return f"({a[0]} if {a[0]} >= {a[1]} else {a[1]})"
        if op == "select":
            return f"({a[1]} if {a[0]} else {a[2]})"
        unary = {"neg": "(-{})", "pos": "(+{})", "not": "(not {})", "truth": "bool({})",
                 "abs": "abs({})", "int": "_trunc({})", "float": "float({})", "ceil": "_ceil({})",
                 "float32": "_f32({})"}
        if op in unary:
            return unary[op].format(a[0])
        if op == "lookup":
            keys, values = n.aux
            t = self.table("T", "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in zip(keys, values)) + "}")
            return f"{t}.get({a[0]}, {lit(values[0])})"
        if op == "nearest":
            return f"_nearest({a[0]}, {self.table('K', lit(tuple(n.aux)))})"
        if op == "member":
            return f"({a[0]} in {self.table('S', 'frozenset(' + lit(tuple(n.aux)) + ')')})"
        raise KeyError(f"no code for op {op!r}")

    def operand(self, a: Any) -> str:
        if isinstance(a, Node) and a.id in self.known:
            return lit(self.known[a.id])
        if isinstance(a, Node) and a.id in self.pinned:
            return f"v{a.id}"
        return operand(a)

    def _fold(self, n: Node) -> bool:
        if n.id in self.known:
            return True
        if n.op == "knob" and n.aux[0] in self.knob_values:
            self.known[n.id] = self.knob_values[n.aux[0]]
            return True
        if n.op in ("input", "knob") or n.id in self.pinned:
            return False
        if all(not isinstance(x, Node) or x.id in self.known for x in n.args):
            args = tuple(self.known[x.id] if isinstance(x, Node) else x for x in n.args)
            self.known[n.id] = ops.apply(n.op, args, n.aux)
            return True
        return False

    def lines(self, roots: Iterable[Any], indent: str = "    ") -> list[str]:
        return [f"{indent}v{n.id} = {self.expr(n)}" for n in self.slice(roots)
                if not self._fold(n) and not (n.op == "input" and n.id not in self.pinned)]

    def prelude(self) -> list[str]:
        return [f"{k} = {v}" for k, v in self.tables.items()]
