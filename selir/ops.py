"""Concrete semantics of every graph operation, shared by folding, evaluation and generated code.

Operations are total: a division by zero or a missing table key yields a placeholder instead of
raising, because the dataflow graph evaluates both arms of a conditional. Where such a value could
reach a live path, the specializer adds an implicit `require` that rejects the input instead.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Callable


def fdiv(a: Any, b: Any) -> Any:
    return a // b if b != 0 else 0


def tdiv(a: Any, b: Any) -> Any:
    return a / b if b != 0 else 0.0


def mod(a: Any, b: Any) -> Any:
    return a % b if b != 0 else 0


def power(a: Any, b: Any) -> Any:
    try:
        return a ** b if not (a == 0 and b < 0) else 0
    except OverflowError:
        return math.inf


def ceil(x: Any) -> int:
    return math.ceil(x) if math.isfinite(x) else 0


def to_float32(x: Any) -> float:
    """Round to the nearest float32 (ties to even), as a C float cast does; overflow gives inf."""
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


_F32 = struct.Struct("f")


def trunc(x: Any) -> int:
    return int(x) if isinstance(x, str) or math.isfinite(x) else 0


def lookup(key: Any, keys: tuple, values: tuple) -> Any:
    for k, v in zip(keys, values):
        if k == key:
            return v
    return values[0]


def nearest(key: Any, keys: tuple) -> Any:
    best, dist = keys[0], abs(keys[0] - key)
    for k in keys[1:]:
        d = abs(k - key)
        if d < dist:
            best, dist = k, d
    return best


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "truediv": tdiv, "floordiv": fdiv, "mod": mod, "pow": power,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "min": lambda a, b: a if a <= b else b, "max": lambda a, b: a if a >= b else b,
}
UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": lambda a: -a, "pos": lambda a: +a, "not": lambda a: not a, "truth": bool,
    "abs": abs, "int": trunc, "float": float, "ceil": ceil, "float32": to_float32,
}
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
          "pow": "**", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
FROM_SYNTAX = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
               "**": "pow", "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def apply(op: str, args: tuple, aux: Any) -> Any:
    """Evaluate one operation on concrete values."""
    if op in BINARY:
        return BINARY[op](*args)
    if op in UNARY:
        return UNARY[op](args[0])
    if op == "select":
        return args[1] if args[0] else args[2]
    if op == "lookup":
        return lookup(args[0], aux[0], aux[1])
    if op == "nearest":
        return nearest(args[0], aux)
    if op == "member":
        return args[0] in aux
    raise KeyError(f"no concrete semantics for op {op!r}")
