"""The statement and expression evaluator behind specialization.

Returns are handled with a return condition instead of duplicating continuations: a block yields
(when it returned, what it returned); later statements run under "not yet returned" and earlier
returns win. Conditions (`require`/`assume`, and implicit ones for division and table keys) are
guarded by the path condition under which they are reached.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from detent_rl.selir import syntax as S
from detent_rl.selir.errors import SelIRError
from detent_rl.selir.exprs import eval_expr
from detent_rl.selir.graph import Builder, Node
from detent_rl.selir.values import shape, zip_leaves


@dataclass(frozen=True)
class Cond:
    """A require/assume (explicit or implicit), already guarded by its path condition."""
    kind: str
    value: Any  # Node (bool) or a constant
    line: int
    file: str
    text: str
    message: str = ""

    def describe(self) -> str:
        msg = f" ({self.message})" if self.message else ""
        return f"{self.kind}({self.text}){msg} at {self.file}:{self.line}"


class Evaluator:
    def __init__(self, builder: Builder, knob_values: Optional[dict], concrete: bool) -> None:
        self.b = builder
        self.knob_values = knob_values
        self.concrete = concrete
        self.conditions: list = []
        self.knobs: dict[str, tuple] = {}
        self.knob_nodes: dict[str, Node] = {}
        self.stack: list[Any] = []

    def fail(self, prog: Any, line: int, msg: str) -> SelIRError:
        return SelIRError(msg, file=prog.file, line=line)

    # ---- booleans over path conditions -------------------------------------------------
    def truth(self, v: Any) -> Any:
        if isinstance(v, Node) and v.type == "bool":
            return v
        return self.b.make("truth", v)

    # Path and return conditions are bookkeeping, not analysis: they simplify at every level.
    def and_(self, a: Any, b: Any) -> Any:
        if a is False or b is False:
            return False
        if a is True:
            return b
        return a if b is True else self.b.make("select", a, b, False)

    def or_(self, a: Any, b: Any) -> Any:
        if a is True or b is True:
            return True
        if a is False:
            return b
        return a if b is False else self.b.make("select", a, True, b)

    def not_(self, a: Any) -> Any:
        return self.b.make("not", a)

    def merge(self, c: Any, a: Any, b: Any, prog: Any, line: int) -> Any:
        if not isinstance(c, Node):
            return a if c else b
        if shape(a) != shape(b):
            raise self.fail(prog, line, "two paths give values of different shapes "
                                        f"({shape(a)} vs {shape(b)}); every return of a selection "
                                        "must give the same selection points")
        return zip_leaves(lambda x, y: x if _same(x, y) else self.b.make("select", c, x, y), a, b)

    # ---- statements --------------------------------------------------------------------
    def block(self, prog: Any, stmts: tuple, env: dict, pc: Any) -> tuple[Any, Any]:
        return self.sequence(prog, ((st.line, lambda live, st=st: self.stmt(prog, st, env, live))
                                    for st in stmts), pc)

    def sequence(self, prog: Any, steps, pc: Any) -> tuple[Any, Any]:
        """Run (line, step) pairs; a step returns (return condition, returned value)."""
        ret_c, ret_v = False, None
        for line, step in steps:
            live = self.and_(pc, self.not_(ret_c))
            if live is False:
                break
            c, v = step(live)
            if c is False:
                continue
            ret_v = v if ret_c is False else self.merge(ret_c, ret_v, v, prog, line)
            ret_c = self.or_(ret_c, c)
            if ret_c is True:
                break
        return ret_c, ret_v

    def stmt(self, prog: Any, st: S.Stmt, env: dict, pc: Any) -> tuple[Any, Any]:
        if isinstance(st, S.Assign):
            v = self.expr(prog, st.value, env, pc)
            self.bind(prog, st.line, st.targets, v, env)
            return False, None
        if isinstance(st, S.Return):
            return True, self.expr(prog, st.value, env, pc)
        if isinstance(st, S.Check):
            v = self.truth(self.expr(prog, st.cond, env, pc))
            self.condition(prog, st.kind, v, pc, st.line, st.text, st.message)
            return False, None
        if isinstance(st, S.If):
            test = self.truth(self.expr(prog, st.test, env, pc))
            if not isinstance(test, Node):
                return self.block(prog, st.body if test else st.orelse, env, pc)
            env_t, env_e = dict(env), dict(env)
            ct, vt = self.block(prog, st.body, env_t, self.and_(pc, test))
            ce, ve = self.block(prog, st.orelse, env_e, self.and_(pc, self.not_(test)))
            if ct is True:
                env.clear(), env.update(env_e)
            elif ce is True:
                env.clear(), env.update(env_t)
            else:
                for k in sorted(set(env_t) | set(env_e)):  # sorted: node ids must not depend on hashing
                    if k in env_t and k in env_e:
                        env[k] = self.merge(test, env_t[k], env_e[k], prog, st.line)
                        if isinstance(env[k], Node):  # a value merged from branches keeps its name
                            self.b.names.setdefault(env[k].id, k)
                    else:
                        env[k] = env_t.get(k, env_e.get(k))
            c = self.or_(self.and_(test, ct), self.and_(self.not_(test), ce))
            if c is False:
                return False, None
            if ct is False:
                return c, ve
            if ce is False:
                return c, vt
            return c, self.merge(test, vt, ve, prog, st.line)
        if isinstance(st, S.For):
            coll = self.iterable(prog, st, env, pc)

            def body(live, item):
                self.bind(prog, st.line, st.targets, item, env)
                return self.block(prog, st.body, env, live)

            return self.sequence(prog, ((st.line, lambda live, it=it: body(live, it)) for it in coll), pc)
        raise self.fail(prog, st.line, f"unsupported statement {type(st).__name__}")

    def iterable(self, prog: Any, st: S.For, env: dict, pc: Any) -> tuple:
        it = st.iter
        if isinstance(it, S.Call) and it.func == "range":
            args = [self.expr(prog, a, env, pc) for a in it.args]
            if it.kwargs or not 1 <= len(args) <= 3 or any(type(a) is not int for a in args):
                raise self.fail(prog, st.line, "range(...) in a for loop needs 1-3 integer arguments "
                                               "that are constant after specialization")
            return tuple(range(*args))
        coll = self.expr(prog, it, env, pc)
        if isinstance(coll, dict):
            return tuple(coll.keys())
        if isinstance(coll, tuple):
            return coll
        raise self.fail(prog, st.line, "a for loop must iterate over a static tuple, table or range "
                                       "(this one is not known after specialization)")

    def bind(self, prog: Any, line: int, targets: tuple, v: Any, env: dict) -> None:
        if len(targets) == 1:
            env[targets[0]] = v
            if isinstance(v, Node):  # the program's own name for a value names its pin
                self.b.names.setdefault(v.id, targets[0])
            return
        if not isinstance(v, tuple) or len(v) != len(targets):
            raise self.fail(prog, line, f"cannot unpack into {len(targets)} names")
        env.update(zip(targets, v))

    def condition(self, prog: Any, kind: str, v: Any, pc: Any, line: int, text: str, msg: str = "") -> None:
        guarded = self.b.make("select", pc, v, True)
        if guarded is not True:
            self.conditions.append(Cond(kind, guarded, line, prog.file, text, msg))

    # ---- expressions -------------------------------------------------------------------
    def expr(self, prog: Any, e: S.Expr, env: dict, pc: Any) -> Any:
        return eval_expr(self, prog, e, env, pc)


def _same(x: Any, y: Any) -> bool:
    """Merging a value with itself is bookkeeping (a variable neither branch assigned)."""
    return x is y or (not isinstance(x, Node) and not isinstance(y, Node) and type(x) is type(y) and x == y)
