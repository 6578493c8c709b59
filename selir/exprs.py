"""Expression evaluation for the partial evaluator (constants fold, the rest builds nodes)."""
from __future__ import annotations

from typing import Any

from detent_rl.selir import ops, syntax as S
from detent_rl.selir.calls import eval_call
from detent_rl.selir.graph import Node
from detent_rl.selir.values import as_rec, is_static, shape, zip_leaves


def eval_expr(ev: Any, prog: Any, e: S.Expr, env: dict, pc: Any) -> Any:
    b = ev.b
    rec = lambda x, p=pc: eval_expr(ev, prog, x, env, p)  # noqa: E731
    if isinstance(e, S.Const):
        return e.value
    if isinstance(e, S.Name):
        if e.id not in env:
            raise ev.fail(prog, e.line, f"name '{e.id}' is used before it is assigned")
        return env[e.id]
    if isinstance(e, S.Global):
        return e.value
    if isinstance(e, S.Bin):
        left, r = rec(e.left), rec(e.right)
        op = ops.FROM_SYNTAX[e.op]
        _scalar(ev, prog, e, left, r)
        if op in ("floordiv", "truediv", "mod") and isinstance(r, Node):
            ev.condition(prog, "require", b.make("ne", r, 0), pc, e.line,
                         f"divisor of {_src(e)} != 0", "implicit: division by zero")
        elif op in ("floordiv", "truediv", "mod") and type(r) in (int, float, bool) and r == 0:
            ev.condition(prog, "require", False, pc, e.line, f"divisor of {_src(e)} != 0",
                         "implicit: division by zero")
        return b.make(op, left, r)
    if isinstance(e, S.Unary):
        v = rec(e.operand)
        if e.op == "not":
            return b.make("not", v)
        _scalar(ev, prog, e, v)
        return b.make("neg" if e.op == "-" else "pos", v)
    if isinstance(e, S.Compare):
        left, r = rec(e.left), rec(e.right)
        if e.op in ("in", "notin"):
            v = _member(ev, prog, e, left, r)
            return b.make("not", v) if e.op == "notin" else v
        if shape(left) != "scalar" or shape(r) != "scalar":
            if is_static(left) and is_static(r):
                return ops.BINARY[ops.FROM_SYNTAX[e.op]](left, r)
            raise ev.fail(prog, e.line, f"comparison of structured values in '{_src(e)}' is not supported")
        return b.make(ops.FROM_SYNTAX[e.op], left, r)
    if isinstance(e, S.BoolOp):
        v = rec(e.values[0])
        for nxt in e.values[1:]:
            t = ev.truth(v)
            if not isinstance(t, Node):
                if (e.op == "and") != bool(t):
                    return v
                v = rec(nxt)
                continue
            guard = ev.and_(pc, t if e.op == "and" else ev.not_(t))
            w = eval_expr(ev, prog, nxt, env, guard)
            if t is v and shape(w) == "scalar":  # v is a bool: `v and w` is False when v is
                v = ev.b.make("select", t, w, False) if e.op == "and" else ev.b.make("select", t, True, w)
            else:
                v = ev.merge(t, w, v, prog, e.line) if e.op == "and" else ev.merge(t, v, w, prog, e.line)
        return v
    if isinstance(e, S.IfExp):
        t = ev.truth(rec(e.test))
        if not isinstance(t, Node):
            return rec(e.body if t else e.orelse)
        x = eval_expr(ev, prog, e.body, env, ev.and_(pc, t))
        y = eval_expr(ev, prog, e.orelse, env, ev.and_(pc, ev.not_(t)))
        return ev.merge(t, x, y, prog, e.line)
    if isinstance(e, S.Attr):
        v = rec(e.value)
        r = as_rec(v)
        if r is None:
            raise ev.fail(prog, e.line, f"'{_src(e)}': only records have attributes")
        try:
            return r.get(e.attr)
        except KeyError:
            raise ev.fail(prog, e.line, f"record {r.cls.__name__} has no field '{e.attr}'") from None
    if isinstance(e, S.Index):
        return _index(ev, prog, e, rec(e.value), rec(e.key), pc)
    if isinstance(e, S.TupleLit):
        return tuple(rec(x) for x in e.items)
    if isinstance(e, S.DictLit):
        keys = [rec(k) for k in e.keys]
        if any(isinstance(k, Node) for k in keys):
            raise ev.fail(prog, e.line, "dict keys must be constant after specialization")
        return {k: rec(v) for k, v in zip(keys, e.values)}
    if isinstance(e, S.Call):
        return eval_call(ev, prog, e, [rec(a) for a in e.args], {k: rec(v) for k, v in e.kwargs}, env, pc)
    raise ev.fail(prog, e.line, f"unsupported expression {type(e).__name__}")


def _src(e: S.Expr) -> str:
    return f"the expression at line {e.line}"


def _scalar(ev: Any, prog: Any, e: S.Expr, *vals: Any) -> None:
    for v in vals:
        if shape(v) != "scalar":
            raise ev.fail(prog, e.line, "arithmetic on a tuple, table or record is not supported")


def _member(ev: Any, prog: Any, e: S.Expr, x: Any, coll: Any) -> Any:
    items = tuple(coll.keys()) if isinstance(coll, dict) else coll
    if not isinstance(items, tuple):
        raise ev.fail(prog, e.line, "'in' needs a static tuple or table on its right")
    if not isinstance(x, Node) and all(not isinstance(i, Node) for i in items):
        return x in items
    if isinstance(x, Node) and all(not isinstance(i, Node) and shape(i) == "scalar" for i in items):
        return ev.b.make("member", x, aux=tuple(items))
    out: Any = False
    for i in items:
        out = ev.or_(out, ev.b.make("eq", x, i))
    return out


def _index(ev: Any, prog: Any, e: S.Index, coll: Any, key: Any, pc: Any) -> Any:
    b = ev.b
    if not isinstance(key, Node):
        try:
            return coll[key]
        except (KeyError, IndexError, TypeError):
            if ev.concrete:
                ev.condition(prog, "require", False, pc, e.line, f"key {key!r} is in the table",
                             "implicit: table look-up")
                return _first(coll)
            raise ev.fail(prog, e.line, f"key {key!r} is not in the table") from None
    if isinstance(coll, dict):
        keys, rows = tuple(coll.keys()), tuple(coll.values())
    elif isinstance(coll, tuple):
        keys, rows = tuple(range(len(coll))), coll
    else:
        raise ev.fail(prog, e.line, "only static tables and tuples can be indexed")
    if not rows:
        raise ev.fail(prog, e.line, "look-up in an empty table")
    if any(shape(r) != shape(rows[0]) for r in rows):
        raise ev.fail(prog, e.line, "table rows must all have one shape to be looked up by a runtime key")
    ev.condition(prog, "require", b.make("member", key, aux=keys), pc, e.line,
                 "look-up key is in the table", "implicit: table look-up")
    if all(is_static(r) for r in rows):
        return zip_leaves(lambda *col: b.make("lookup", key, aux=(keys, col)), *rows)
    out = rows[-1]
    for k, r in zip(reversed(keys[:-1]), reversed(rows[:-1])):
        out = ev.merge(b.make("eq", key, k), r, out, prog, e.line)
    return out


def _first(coll: Any) -> Any:
    if isinstance(coll, dict):
        return next(iter(coll.values()))
    return coll[0]
