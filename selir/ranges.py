"""Value ranges: one function per operation mapping operand intervals to a result interval.

The fallback is the full range, so an imprecise answer is still sound. Booleans are 0/1.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from detent_rl.selir.ops import to_float32

Interval = tuple[float, float]
FULL: Interval = (-math.inf, math.inf)
BOOL: Interval = (0, 1)


def of_const(v: Any) -> Optional[Interval]:
    if isinstance(v, (bool, int, float)):
        return (v, v) if not (isinstance(v, float) and math.isnan(v)) else FULL
    return None


def _mul(a: float, b: float) -> float:
    return 0 if a == 0 or b == 0 else a * b


def _corners(f, a: Interval, b: Interval) -> Interval:
    vals = [f(x, y) for x in a for y in b]
    if any(isinstance(v, float) and math.isnan(v) for v in vals):
        return FULL
    return (min(vals), max(vals))


def _div_ok(b: Interval) -> bool:
    return b[0] > 0 or b[1] < 0


def compare(op: str, a: Interval, b: Interval) -> Optional[bool]:
    """Decide a comparison from intervals, or None when the intervals overlap."""
    if op == "lt":
        return True if a[1] < b[0] else False if a[0] >= b[1] else None
    if op == "le":
        return True if a[1] <= b[0] else False if a[0] > b[1] else None
    if op == "gt":
        return compare("lt", b, a)
    if op == "ge":
        return compare("le", b, a)
    if op == "eq":
        if a[0] == a[1] == b[0] == b[1]:
            return True
        return False if a[1] < b[0] or b[1] < a[0] else None
    if op == "ne":
        r = compare("eq", a, b)
        return None if r is None else not r
    return None


def interval(op: str, args: tuple[Optional[Interval], ...], aux: Any, is_int: bool) -> Interval:
    """The result interval of `op`; operands with no numeric interval give the full range."""
    if op in ("lt", "le", "gt", "ge", "eq", "ne", "not", "truth", "member"):
        return BOOL
    if any(a is None for a in args) and op not in ("lookup", "nearest", "select"):
        return FULL
    if op == "add":
        return (args[0][0] + args[1][0], args[0][1] + args[1][1])
    if op == "sub":
        return (args[0][0] - args[1][1], args[0][1] - args[1][0])
    if op == "mul":
        return _corners(_mul, args[0], args[1])
    if op == "pow":  # a**b (a > 0, or a >= 0 with b >= 0) is monotone in each argument: corners
        a, b = args
        ok = a[0] > 0 or (a[0] >= 0 and b[0] >= 0)
        if ok and all(map(math.isfinite, a + b)) and -1000 <= b[0] and b[1] <= 64:
            return _corners(lambda x, y: float(x) ** y if isinstance(x, float) else x ** y, a, b)
        return FULL
    if op == "neg":
        return (-args[0][1], -args[0][0])
    if op == "pos":
        return args[0]
    if op in ("floordiv", "truediv"):
        a, b = args
        if not _div_ok(b):
            return FULL
        q = _corners(lambda x, y: x / y, a, b)
        if op == "floordiv":  # floor is monotone, so flooring the corners bounds every quotient
            return tuple(math.floor(v) if math.isfinite(v) else v for v in q)
        return q
    if op == "mod":
        a, b = args
        if b[0] > 0:
            if a[0] >= 0 and a[1] < b[0]:
                return a
            return (0, b[1] - 1) if is_int else (0, b[1])
        return FULL
    if op in ("min", "max"):
        f = min if op == "min" else max
        return (f(args[0][0], args[1][0]), f(args[0][1], args[1][1]))
    if op == "abs":
        lo, hi = args[0]
        if lo >= 0:
            return (lo, hi)
        if hi <= 0:
            return (-hi, -lo)
        return (0, max(-lo, hi))
    if op in ("ceil", "int"):
        lo, hi = args[0]
        f = math.ceil if op == "ceil" else math.trunc
        return (f(lo) if math.isfinite(lo) else lo, f(hi) if math.isfinite(hi) else hi)
    if op == "float":
        return args[0]
    if op == "float32":  # rounding to nearest is monotone
        return (to_float32(args[0][0]), to_float32(args[0][1]))
    if op == "select":
        a, b = args[1], args[2]
        if a is None or b is None:
            return FULL
        return (min(a[0], b[0]), max(a[1], b[1]))
    if op == "lookup":
        nums = [of_const(v) for v in aux[1]]
        if any(n is None for n in nums):
            return FULL
        return (min(n[0] for n in nums), max(n[1] for n in nums))
    if op == "nearest":
        keys = aux
        if args[0] is not None:
            keys = reachable_keys(keys, args[0])
        return (min(keys), max(keys))
    return FULL


def reachable_keys(keys: tuple, key_range: Interval) -> tuple:
    """The keys `nearest` can return for a key in `key_range` (first key wins ties)."""
    lo, hi = key_range
    out = set()
    for end in (lo, hi):
        best = min(abs(k - end) for k in keys)
        out.update(k for k in keys if abs(k - end) == best)
    out.update(k for k in keys if lo <= k <= hi)
    return tuple(k for k in keys if k in out)
