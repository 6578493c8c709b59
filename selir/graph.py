"""Hash-consed dataflow nodes and the builder that simplifies them as they are made.

A node is made once per (op, operands, aux): equal computations share one node, so the graph the
solver cuts has no duplicates. Simplification is a list of rewrite rules run by one driver
(`Builder.make`); which rules run is the specialization level:
  fold  — constant folding only (the ablation);
  full  — plus algebraic identities and range-based rules (decided comparisons, min/max/mod
          with disjoint ranges, single-valued look-ups).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Union

from detent_rl.selir import ops, ranges
from detent_rl.selir.ranges import Interval

LEVELS = ("fold", "full")


class Node:
    """One value of the program. Operands are Nodes or Python constants."""

    __slots__ = ("id", "op", "args", "aux", "type", "range", "__weakref__")

    def __init__(self, id: int, op: str, args: tuple, aux: Any, type: str, range: Interval) -> None:
        self.id, self.op, self.args, self.aux, self.type, self.range = id, op, args, aux, type, range

    @property
    def operands(self) -> tuple["Node", ...]:
        return tuple(a for a in self.args if isinstance(a, Node))

    def __repr__(self) -> str:
        if self.op in ("input", "knob"):
            return f"%{self.id}:{self.op}({self.aux[0]})"
        return f"%{self.id}:{self.op}"


Value = Union[Node, bool, int, float, str, None]


def const_type(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(type(v), "any")


def _key(a: Any) -> Any:
    return ("n", a.id) if isinstance(a, Node) else ("c", type(a).__name__, a)


def _result_type(op: str, types: list[str]) -> str:
    if op in ops.COMPARISONS or op in ("not", "truth", "member"):
        return "bool"
    if op in ("truediv", "float", "float32"):
        return "float"
    if op in ("int", "ceil"):
        return "int"
    if op in ("select",):
        t = set(types[1:])
        return t.pop() if len(t) == 1 else ("int" if t <= {"int", "bool"} else "any")
    num = [t for t in types]
    if "any" in num or "str" in num:
        return "any"
    if "float" in num:
        return "float"
    return "int"


class Builder:
    def __init__(self, level: str = "full", input_ranges: Optional[dict[str, Interval]] = None) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown specialization level {level!r}; expected one of {LEVELS}")
        self.level = level
        self.input_ranges = input_ranges or {}
        self.nodes: list[Node] = []
        self.names: dict[int, str] = {}  # node id -> the program variable first bound to it
        self._interned: dict[tuple, Node] = {}
        self.rules: list[Callable[[str, tuple, Any], Any]] = [self._fold]
        if level == "full":
            self.rules += [self._algebra, self._by_range]

    # ---- making nodes -------------------------------------------------------------------
    def leaf(self, op: str, aux: tuple, type: str, range: Optional[Interval] = None) -> Node:
        """An input or knob node."""
        if range is None:
            range = ranges.BOOL if type == "bool" else ranges.FULL
        return self._intern(op, (), aux, type, range)

    def make(self, op: str, *args: Any, aux: Any = None) -> Value:
        for rule in self.rules:
            out = rule(op, args, aux)
            if out is not _NO:
                return out
        types = [a.type if isinstance(a, Node) else const_type(a) for a in args]
        t = _result_type(op, types)
        if op == "select":  # path-sensitive: `x if x > 0 else 1` is at least 1
            arg_ranges = (self.range(args[0]), _refine(args[0], args[1], True, self.range(args[1])),
                          _refine(args[0], args[2], False, self.range(args[2])))
        else:
            arg_ranges = tuple(self.range(a) for a in args)
        rng = ranges.interval(op, arg_ranges, aux, t in ("int", "bool"))
        if op == "floordiv":
            rng = self._cdiv_range(args, rng)
        return self._intern(op, args, aux, t, rng)

    def _intern(self, op: str, args: tuple, aux: Any, type: str, rng: Interval) -> Node:
        key = (op, tuple(_key(a) for a in args), aux)
        node = self._interned.get(key)
        if node is None:
            node = Node(len(self.nodes), op, args, aux, type, rng)
            self.nodes.append(node)
            self._interned[key] = node
        return node

    def _cdiv_range(self, args: tuple, rng: Interval) -> Interval:
        """`(x + d - 1) // d` is ceil(x / d): keep the correlation interval arithmetic loses."""
        n, d = args
        if not (isinstance(n, Node) and n.op == "sub" and n.args[1] == 1 and type(n.args[1]) is int):
            return rng
        add = n.args[0]
        if not (isinstance(add, Node) and add.op == "add"):
            return rng
        x, d2 = add.args
        if not (d2 is d or (not isinstance(d, Node) and not isinstance(d2, Node) and d2 == d)):
            return rng
        rx, rd = self.range(x), self.range(d)
        if rx is None or rd is None or rx[0] < 0 or rd[0] <= 0 or not _is(x, "int") or not _is(d, "int"):
            return rng
        lo = -(-rx[0] // rd[1]) if math.isfinite(rd[1]) else (1 if rx[0] > 0 else 0)
        hi = -(-rx[1] // rd[0]) if math.isfinite(rx[1]) else rx[1]
        return (max(rng[0], lo), min(rng[1], hi))

    @staticmethod
    def range(v: Any) -> Optional[Interval]:
        return v.range if isinstance(v, Node) else ranges.of_const(v)

    # ---- rewrite rules: each returns _NO when it does not apply -----------------------
    def _fold(self, op: str, args: tuple, aux: Any) -> Any:
        if op == "select" and not isinstance(args[0], Node):
            return args[1] if args[0] else args[2]
        if any(isinstance(a, Node) for a in args):
            return _NO
        return ops.apply(op, args, aux)

    def _algebra(self, op: str, args: tuple, aux: Any) -> Any:
        a = args[0] if args else None
        b = args[1] if len(args) > 1 else None
        is_int = all(isinstance(x, Node) and x.type in ("int", "bool") or type(x) in (int, bool)
                     for x in args)
        if op == "add" and is_int:
            if b == 0 and type(b) is int and _is(a, "int"):
                return a
            if a == 0 and type(a) is int and _is(b, "int"):
                return b
        if op == "sub" and is_int:
            if b == 0 and type(b) is int and _is(a, "int"):
                return a
            if a is b:
                return 0
        if op == "mul" and is_int:
            for x, y in ((a, b), (b, a)):
                if type(y) is int and y == 1 and _is(x, "int"):
                    return x
                if type(y) is int and y == 0:
                    return 0
        if op in ("floordiv",) and is_int and type(b) is int and b == 1 and _is(a, "int"):
            return a
        if op == "mod" and is_int and type(b) is int and b == 1:
            return 0
        if op in ("min", "max") and a is b:
            return a
        if op in ("eq", "le", "ge") and a is b and isinstance(a, Node) and a.type in ("int", "bool", "str"):
            return True
        if op in ("ne", "lt", "gt") and a is b and isinstance(a, Node) and a.type in ("int", "bool", "str"):
            return False
        if op == "select":
            c, x, y = args
            if x is y or (not isinstance(x, Node) and not isinstance(y, Node)
                          and type(x) is type(y) and x == y):
                return x
            if isinstance(c, Node) and c.type == "bool" and x is True and y is False:
                return c
            if isinstance(c, Node) and c.op == "not":
                return self.make("select", c.args[0], y, x)
            if x is True and _negates(c, y):  # c or (not c)
                return True
            if y is False and _negates(c, x):  # c and (not c)
                return False
        if op == "truth" and isinstance(a, Node) and a.type == "bool":
            return a
        if op == "not" and isinstance(a, Node) and a.op == "not" and _is(a.args[0], "bool"):
            return a.args[0]
        return _NO

    def _by_range(self, op: str, args: tuple, aux: Any) -> Any:
        rs = [self.range(a) for a in args]
        if op in ops.COMPARISONS and all(r is not None for r in rs) and _numeric(args):
            d = ranges.compare(op, rs[0], rs[1])
            if d is not None:
                return d
        if op in ("min", "max") and all(r is not None for r in rs) and _numeric(args):
            a, b = args
            first_wins = rs[0][1] <= rs[1][0] if op == "min" else rs[0][0] >= rs[1][1]
            second_wins = rs[1][1] < rs[0][0] if op == "min" else rs[1][0] > rs[0][1]
            if first_wins:
                return a
            if second_wins:
                return b
        if op == "abs" and rs[0] is not None and rs[0][0] >= 0 and _is(args[0], "int"):
            return args[0]
        if op == "mod" and rs[0] is not None and rs[1] is not None and _is(args[0], "int") \
                and rs[0][0] >= 0 and rs[1][0] > rs[0][1]:
            return args[0]
        if op == "floordiv" and rs[0] is not None and rs[1] is not None and _is(args[0], "int") \
                and rs[0][0] >= 0 and rs[1][0] > rs[0][1]:
            return 0
        if op in ("truth", "select"):
            r = rs[0]
            if r is not None and isinstance(args[0], Node) and (r[0] > 0 or r[1] < 0 or r == (0, 0)):
                truthy = r != (0, 0)
                return (True if truthy else False) if op == "truth" else (args[1] if truthy else args[2])
        if op == "nearest" and rs[0] is not None:
            keys = ranges.reachable_keys(aux, rs[0])
            if len(keys) == 1:
                return keys[0]
            if len(keys) < len(aux):
                return self.make("nearest", *args, aux=keys)
        if op == "member" and isinstance(args[0], Node) and args[0].op in ("nearest", "lookup"):
            possible = args[0].aux if args[0].op == "nearest" else args[0].aux[1]
            if all(v in aux for v in possible):
                return True
        if op == "member" and rs[0] is not None and all(isinstance(v, (int, float)) for v in aux):
            lo, hi = rs[0]
            if not any(lo <= v <= hi for v in aux):
                return False
            if _is(args[0], "int") and math.isfinite(hi - lo) and hi - lo < 4096 \
                    and all(v in aux for v in range(int(lo), int(hi) + 1)):
                return True
        return _NO


_NEGATION = {"eq": "ne", "ne": "eq", "lt": "ge", "ge": "lt", "le": "gt", "gt": "le"}


def _negates(a: Any, b: Any) -> bool:
    """Whether bool node b is the negation of bool node a (same operands, opposite comparison)."""
    if not (isinstance(a, Node) and isinstance(b, Node)):
        return False
    if b.op == "not" and b.args[0] is a or a.op == "not" and a.args[0] is b:
        return True
    return _NEGATION.get(a.op) == b.op and a.args == b.args and \
        all(x is y for x, y in zip(a.args, b.args)) and a.type == b.type == "bool" and \
        all(not isinstance(x, Node) or x.type in ("int", "bool", "str") for x in a.args)


def _refine(cond: Any, value: Any, holds: bool, rng: Optional[Interval]) -> Optional[Interval]:
    """Narrow value's range on the arm of `select(cond, ...)` where cond is `holds`."""
    if rng is None or not isinstance(cond, Node) or cond.op not in _NEGATION or not isinstance(value, Node):
        return rng
    op = cond.op if holds else _NEGATION[cond.op]
    a, b = cond.args
    if b is value and a is not value:
        a, b, op = b, a, {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le", "eq": "eq", "ne": "ne"}[op]
    if a is not value or isinstance(b, Node) or type(b) not in (int, float):
        return rng
    lo, hi = rng
    step = 1 if value.type == "int" and type(b) is int else 0
    if op == "gt":
        lo = max(lo, b + step)
    elif op == "ge":
        lo = max(lo, b)
    elif op == "lt":
        hi = min(hi, b - step)
    elif op == "le":
        hi = min(hi, b)
    elif op == "eq":
        lo, hi = max(lo, b), min(hi, b)
    return (lo, hi) if lo <= hi else rng


def _is(v: Any, t: str) -> bool:
    if isinstance(v, Node):
        return v.type == t
    return const_type(v) == t


def _numeric(args: tuple) -> bool:
    return all((a.type in ("int", "float", "bool")) if isinstance(a, Node) else type(a) in (int, float, bool)
               for a in args)


class _NoMatch:
    def __repr__(self) -> str:
        return "<no rewrite>"


_NO = _NoMatch()
