"""The immutable syntax tree of a parsed selection program (the subset, and nothing more).

Every node carries the source line it came from so that later stages can point at it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Expr:
    line: int


@dataclass(frozen=True)
class Const(Expr):
    value: Any


@dataclass(frozen=True)
class Name(Expr):
    id: str


@dataclass(frozen=True)
class Global(Expr):
    """A name resolved at decoration time: a static table/constant, a record type or a program."""
    id: str
    value: Any


@dataclass(frozen=True)
class Bin(Expr):
    op: str  # + - * / // % **
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # - + not
    operand: Expr


@dataclass(frozen=True)
class Compare(Expr):
    op: str  # < <= > >= == != in notin
    left: Expr
    right: Expr


@dataclass(frozen=True)
class BoolOp(Expr):
    op: str  # and or
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class IfExp(Expr):
    test: Expr
    body: Expr
    orelse: Expr


@dataclass(frozen=True)
class Call(Expr):
    func: str  # a builtin's name, "record", "selection" or "lang"
    target: Any  # the record type / Program for record and selection calls
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class Attr(Expr):
    value: Expr
    attr: str


@dataclass(frozen=True)
class Index(Expr):
    value: Expr
    key: Expr


@dataclass(frozen=True)
class TupleLit(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class DictLit(Expr):
    keys: tuple[Expr, ...]
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class Stmt:
    line: int


@dataclass(frozen=True)
class Assign(Stmt):
    targets: tuple[str, ...]  # one name, or several for tuple unpacking
    value: Expr


@dataclass(frozen=True)
class If(Stmt):
    test: Expr
    body: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...]


@dataclass(frozen=True)
class For(Stmt):
    targets: tuple[str, ...]
    iter: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Check(Stmt):
    kind: str  # require | assume
    cond: Expr
    message: str
    text: str  # the condition's source text, for error messages


@dataclass(frozen=True)
class Return(Stmt):
    value: Expr


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # Runtime | Unpinnable | Fact
    type: str  # int | float | bool | str | tuple | a record's name
