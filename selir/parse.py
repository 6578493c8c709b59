"""`@selection`: parse a Python function's `ast` into SelIR syntax, rejecting anything outside the
subset, and make it a `Program`.

Every rejection names the file, the line and the construct, at decoration time.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
from typing import Any, Callable

from detent_rl.selir import lang, syntax as S
from detent_rl.selir.errors import SelIRError
from detent_rl.selir.program import Program

BUILTINS = ("min", "max", "abs", "int", "float", "bool", "len", "range")
LANG_CALLS = ("knob", "nearest_key", "ceil", "float32")
CHECKS = ("require", "assume")
SCALAR_TYPES = ("int", "float", "bool", "str", "tuple")

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.In: "in", ast.NotIn: "notin"}
_NAMES = {
    ast.While: "while loop", ast.Import: "import", ast.ImportFrom: "import", ast.Global: "global",
    ast.Nonlocal: "nonlocal", ast.Try: "try", ast.With: "with", ast.Raise: "raise",
    ast.Delete: "del", ast.FunctionDef: "nested function", ast.ClassDef: "class definition",
    ast.Lambda: "lambda", ast.ListComp: "list comprehension", ast.GeneratorExp: "generator",
    ast.DictComp: "dict comprehension", ast.SetComp: "set comprehension", ast.List: "list",
    ast.Set: "set", ast.Yield: "yield", ast.Await: "await", ast.Break: "break",
    ast.Continue: "continue", ast.Starred: "starred expression", ast.JoinedStr: "f-string",
    ast.NamedExpr: "walrus assignment", ast.Assert: "assert (use require)",
}


def is_capturable(value: Any) -> bool:
    """Values a program may capture from its module: immutable data, tables and records."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, tuple):
        return all(is_capturable(v) for v in value)
    if isinstance(value, dict):
        return all(is_capturable(k) and is_capturable(v) for k, v in value.items())
    if lang.is_record(value):
        return all(is_capturable(getattr(value, f)) for f in value.__dataclass_fields__)
    return False


def freeze(value: Any) -> Any:
    """A private copy of a captured table, so later mutation cannot change a solved program."""
    if isinstance(value, dict):
        return {freeze(k): freeze(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    return value


class Parser:
    def __init__(self, fn: Callable, file: str, first_line: int, source_lines: list[str]) -> None:
        self.fn = fn
        self.file = file
        self.offset = first_line - 1
        self.lines = source_lines
        self.locals: set[str] = set()
        self.scope = dict(fn.__globals__)
        if fn.__closure__:
            self.scope.update(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))

    def fail(self, node: ast.AST, message: str) -> SelIRError:
        return SelIRError(message, file=self.file, line=self.line(node))

    def line(self, node: ast.AST) -> int:
        return getattr(node, "lineno", 1) + self.offset

    def text(self, node: ast.AST) -> str:
        return ast.unparse(node)

    # ---- function signature ------------------------------------------------------------
    def params(self, fdef: ast.FunctionDef) -> tuple[S.Param, ...]:
        a = fdef.args
        if a.vararg or a.kwarg or a.posonlyargs or a.defaults or a.kw_defaults:
            raise self.fail(fdef, "selection parameters must be plain named parameters without defaults")
        out = []
        for arg in a.args + a.kwonlyargs:
            ann = arg.annotation
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)
                    and ann.value.id in lang.INPUT_KINDS):
                raise self.fail(arg, f"parameter '{arg.arg}' must be annotated Runtime[T], Unpinnable[T], "
                                     "Request[T] or Fact[T]")
            tname = ann.slice.id if isinstance(ann.slice, ast.Name) else None
            if tname is None or (tname not in SCALAR_TYPES and not lang.is_record_type(self.scope.get(tname))):
                raise self.fail(arg, f"parameter '{arg.arg}': unsupported type {ast.unparse(ann.slice)!r}")
            out.append(S.Param(arg.arg, ann.value.id, tname))
            self.locals.add(arg.arg)
        return tuple(out)

    # ---- statements --------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt]) -> tuple[S.Stmt, ...]:
        return tuple(s for s in (self.stmt(x) for x in stmts) if s is not None)

    def stmt(self, node: ast.stmt) -> S.Stmt | None:
        ln = self.line(node)
        if isinstance(node, ast.Assign):
            if len(node.targets) != 1:
                raise self.fail(node, "chained assignment is not supported")
            return S.Assign(ln, self.targets(node.targets[0]), self.expr(node.value))
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            return S.Assign(ln, self.targets(node.target), self.expr(node.value))
        if isinstance(node, ast.AugAssign):
            names = self.targets(node.target)
            op = _BINOPS.get(type(node.op))
            if op is None or len(names) != 1:
                raise self.fail(node, f"augmented assignment '{ast.unparse(node)}' is not supported")
            return S.Assign(ln, names, S.Bin(ln, op, S.Name(ln, names[0]), self.expr(node.value)))
        if isinstance(node, ast.If):
            return S.If(ln, self.expr(node.test), self.block(node.body), self.block(node.orelse))
        if isinstance(node, ast.For):
            if node.orelse:
                raise self.fail(node, "for-else is not supported")
            return S.For(ln, self.targets(node.target), self.expr(node.iter), self.block(node.body))
        if isinstance(node, ast.Return):
            if node.value is None:
                raise self.fail(node, "a selection must return a value")
            return S.Return(ln, self.expr(node.value))
        if isinstance(node, ast.Pass):
            return None
        if isinstance(node, ast.Expr):
            v = node.value
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                return None  # docstring
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in CHECKS \
                    and v.func.id not in self.locals:
                return self.check(v)
            raise self.fail(node, f"expression statement '{ast.unparse(node)}' has no effect or a side "
                                  "effect; only require(...)/assume(...) may stand alone")
        raise self.fail(node, f"{_NAMES.get(type(node), type(node).__name__)} is not allowed in SelIR")

    def check(self, call: ast.Call) -> S.Check:
        kind = call.func.id
        if call.keywords or not 1 <= len(call.args) <= 2:
            raise self.fail(call, f"{kind}(cond[, message]) takes one condition and an optional message")
        msg = ""
        if len(call.args) == 2:
            m = call.args[1]
            if not (isinstance(m, ast.Constant) and isinstance(m.value, str)):
                raise self.fail(call, f"{kind}'s message must be a string literal")
            msg = m.value
        return S.Check(self.line(call), kind, self.expr(call.args[0]), msg, self.text(call.args[0]))

    def targets(self, node: ast.expr) -> tuple[str, ...]:
        if isinstance(node, ast.Name):
            names = (node.id,)
        elif isinstance(node, ast.Tuple) and all(isinstance(e, ast.Name) for e in node.elts):
            names = tuple(e.id for e in node.elts)
        else:
            raise self.fail(node, f"assignment target '{ast.unparse(node)}' is not supported "
                                  "(assign to names only: no attributes, items or starred targets)")
        for n in names:
            if n in lang.INPUT_KINDS or n in BUILTINS or n in LANG_CALLS or n in CHECKS:
                raise self.fail(node, f"assignment to reserved name '{n}'")
        self.locals.update(names)
        return names

    # ---- expressions -------------------------------------------------------------------
    def expr(self, node: ast.expr) -> S.Expr:
        ln = self.line(node)
        if isinstance(node, ast.Constant):
            if not (node.value is None or isinstance(node.value, (bool, int, float, str))):
                raise self.fail(node, f"constant {node.value!r} is not supported")
            return S.Const(ln, node.value)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise self.fail(node, f"operator in '{ast.unparse(node)}' is not supported")
            return S.Bin(ln, op, self.expr(node.left), self.expr(node.right))
        if isinstance(node, ast.UnaryOp):
            op = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not"}.get(type(node.op))
            if op is None:
                raise self.fail(node, f"operator in '{ast.unparse(node)}' is not supported")
            return S.Unary(ln, op, self.expr(node.operand))
        if isinstance(node, ast.Compare):
            parts, left = [], node.left
            for op, right in zip(node.ops, node.comparators):
                o = _CMPOPS.get(type(op))
                if o is None:
                    raise self.fail(node, f"comparison in '{ast.unparse(node)}' is not supported")
                parts.append(S.Compare(ln, o, self.expr(left), self.expr(right)))
                left = right
            return parts[0] if len(parts) == 1 else S.BoolOp(ln, "and", tuple(parts))
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            return S.BoolOp(ln, op, tuple(self.expr(v) for v in node.values))
        if isinstance(node, ast.IfExp):
            return S.IfExp(ln, self.expr(node.test), self.expr(node.body), self.expr(node.orelse))
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Attribute):
            return S.Attr(ln, self.expr(node.value), node.attr)
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Slice):
                raise self.fail(node, "slices are not supported")
            return S.Index(ln, self.expr(node.value), self.expr(node.slice))
        if isinstance(node, ast.Tuple):
            return S.TupleLit(ln, tuple(self.expr(e) for e in node.elts))
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise self.fail(node, "dict unpacking (**) is not supported")
            return S.DictLit(ln, tuple(self.expr(k) for k in node.keys),
                             tuple(self.expr(v) for v in node.values))
        raise self.fail(node, f"{_NAMES.get(type(node), type(node).__name__)} is not allowed in SelIR")

    def name(self, node: ast.Name) -> S.Expr:
        ln = self.line(node)
        if node.id in self.locals:
            return S.Name(ln, node.id)
        if node.id in ("True", "False", "None"):
            return S.Const(ln, {"True": True, "False": False, "None": None}[node.id])
        if node.id not in self.scope:
            if hasattr(builtins, node.id):
                raise self.fail(node, f"builtin '{node.id}' is not allowed in SelIR")
            raise self.fail(node, f"name '{node.id}' is not defined (tables, records and helper "
                                  "selections must be defined before the program that uses them)")
        value = self.scope[node.id]
        if not is_capturable(value):
            raise self.fail(node, f"global '{node.id}' ({type(value).__name__}) is not a static "
                                  "table or constant; programs may only read immutable data")
        return S.Global(ln, node.id, freeze(value))

    def call(self, node: ast.Call) -> S.Expr:
        ln = self.line(node)
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, f"call '{ast.unparse(node.func)}(...)' is not allowed: only builtins "
                                  "min/max/abs/int/float/bool/len, knob, nearest_key, ceil, records and "
                                  "@selection functions may be called")
        fname = node.func.id
        if any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.fail(node, "*args/**kwargs in calls are not supported")
        args = tuple(self.expr(a) for a in node.args)
        kwargs = tuple((k.arg, self.expr(k.value)) for k in node.keywords)
        if fname in self.locals:
            raise self.fail(node, f"'{fname}' is a local value, not a function")
        if fname in CHECKS:
            raise self.fail(node, f"{fname}(...) must stand alone as a statement")
        if fname == self.fn.__name__:
            raise self.fail(node, f"recursive call to '{fname}' is not allowed in SelIR")
        if fname == "range":
            return S.Call(ln, "range", None, args, kwargs)
        if fname in BUILTINS and fname not in self.scope:
            return S.Call(ln, fname, None, args, kwargs)
        target = self.scope.get(fname, getattr(builtins, fname, None))
        if target is None:
            raise self.fail(node, f"call to undefined '{fname}'")
        if isinstance(target, Program):
            return S.Call(ln, "selection", target, args, kwargs)
        if lang.is_record_type(target):
            if args:
                raise self.fail(node, f"record {fname}(...) takes keyword arguments only")
            return S.Call(ln, "record", target, args, kwargs)
        for lname in LANG_CALLS:
            if target is getattr(lang, lname):
                return S.Call(ln, lname, None, args, kwargs)
        raise self.fail(node, f"call to '{fname}' is not allowed in SelIR (no side effects, no "
                              "unknown functions; decorate helpers with @selection)")


def parse_function(fn: Callable, file: str, first_line: int,
                   source: str) -> tuple[tuple[S.Param, ...], tuple[S.Stmt, ...]]:
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise SelIRError("@selection applies to plain functions (not async)", file=file, line=first_line)
    p = Parser(fn, file, first_line, source.splitlines())
    params = p.params(fdef)
    body = p.block(fdef.body)
    if not body:
        raise SelIRError("empty selection program", file=file, line=first_line)
    return params, body


def parse_program(fn: Callable, *, name: str | None = None, schedule: tuple[str, ...] = ()) -> Program:
    """The Program of a plain function: its source read, parsed and checked against the subset."""
    try:
        lines, first = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or "<unknown>"
    except (OSError, TypeError) as e:
        raise SelIRError(f"cannot read the source of {fn.__qualname__}: {e}") from e
    source = textwrap.dedent("".join(lines))
    params, body = parse_function(fn, file, first, source)
    if isinstance(schedule, str) or not all(isinstance(s, str) and s for s in schedule):
        raise SelIRError(f"selection {fn.__qualname__}: schedule must be a tuple of returned names, got {schedule!r}",
                         file=file, line=first)
    return Program(name or fn.__name__, f"{fn.__module__}.{fn.__qualname__}", file, first, params, body, fn,
                   tuple(schedule))


def selection(fn=None, *, name: str | None = None, schedule: tuple[str, ...] = ()):
    """Decorate a selection program: parse it now, reject what the subset does not allow.

    `schedule` names returned values (or records, by their key) that do not change any row's bits —
    launch parameters such as a tile shape, whose invariance was measured for the kernel. They may
    read the batch: the cut does not separate them from the batch's inputs, and they are not pinned;
    their `require`s are still checked on every new input."""

    def wrap(f):
        return parse_program(f, name=name, schedule=schedule)

    return wrap(fn) if fn is not None else wrap
