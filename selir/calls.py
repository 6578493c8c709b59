"""Calls inside programs: builtins, knobs, look-ups, records and inlined helper selections."""
from __future__ import annotations

from typing import Any

from detent_rl.selir import syntax as S
from detent_rl.selir.graph import Node, const_type
from detent_rl.selir.values import Rec, as_rec, is_static, materialize, shape

_MAX_DEPTH = 32


def eval_call(ev: Any, prog: Any, e: S.Call, args: list, kwargs: dict, env: dict, pc: Any) -> Any:
    b = ev.b
    f = e.func
    if f in ("min", "max"):
        if kwargs:
            raise ev.fail(prog, e.line, f"{f}(...) takes no keyword arguments here")
        items = args[0] if len(args) == 1 else tuple(args)
        if isinstance(items, dict):
            items = tuple(items.keys())
        if not isinstance(items, tuple) or not items or any(shape(i) != "scalar" for i in items):
            raise ev.fail(prog, e.line, f"{f}(...) needs scalars or one non-empty static tuple")
        out = items[0]
        for x in items[1:]:
            out = b.make(f, out, x)
        return out
    if f in ("abs", "int", "float", "bool", "ceil", "float32"):
        if len(args) != 1 or kwargs or shape(args[0]) != "scalar":
            raise ev.fail(prog, e.line, f"{f}(x) takes one scalar")
        return b.make("truth" if f == "bool" else f, args[0])
    if f == "len":
        if len(args) != 1 or not isinstance(args[0], (tuple, dict)):
            raise ev.fail(prog, e.line, "len(x) needs a static tuple or table")
        return len(args[0])
    if f == "range":
        raise ev.fail(prog, e.line, "range(...) is only allowed as the collection of a for loop")
    if f == "nearest_key":
        return _nearest(ev, prog, e, args, kwargs)
    if f == "knob":
        return _knob(ev, prog, e, args, kwargs)
    if f == "record":
        return _record(ev, prog, e, kwargs)
    if f == "selection":
        return _inline(ev, prog, e, args, kwargs, pc)
    raise ev.fail(prog, e.line, f"call to '{f}' is not supported")


def _nearest(ev: Any, prog: Any, e: S.Call, args: list, kwargs: dict) -> Any:
    if kwargs or len(args) != 2 or not isinstance(args[0], dict) or not args[0]:
        raise ev.fail(prog, e.line, "nearest_key(table, key) needs a non-empty static table and a key")
    keys = tuple(args[0].keys())
    if not all(type(k) in (int, float) for k in keys):
        raise ev.fail(prog, e.line, "nearest_key needs a table with numeric keys")
    return ev.b.make("nearest", args[1], aux=keys)


def _knob(ev: Any, prog: Any, e: S.Call, args: list, kwargs: dict) -> Any:
    spec = dict(zip(("name", "choices", "default"), args))
    spec.update(kwargs)
    name, choices, default = spec.get("name"), spec.get("choices"), spec.get("default")
    if not isinstance(name, str) or not isinstance(choices, tuple) or not choices \
            or not all(not isinstance(c, Node) and shape(c) == "scalar" for c in choices):
        raise ev.fail(prog, e.line, "knob(name, choices, default) needs a string name and a static "
                                    "non-empty tuple of scalar choices")
    if default not in choices:
        raise ev.fail(prog, e.line, f"knob '{name}': default {default!r} is not one of {choices}")
    known = ev.knobs.get(name)
    if known is not None and known != (choices, default):
        raise ev.fail(prog, e.line, f"knob '{name}' is declared twice with different choices or default")
    ev.knobs[name] = (choices, default)
    if ev.knob_values is not None:
        v = ev.knob_values.get(name, default)
        if v not in choices or isinstance(v, Node):
            raise ev.fail(prog, e.line, f"knob '{name}' = {v!r} is not one of its choices {choices}")
        return v
    types = {const_type(c) for c in choices}
    node = ev.b.leaf("knob", (name, choices, default), types.pop() if len(types) == 1 else "any",
                     (min(choices), max(choices)) if all(type(c) in (int, float) for c in choices) else None)
    ev.knob_nodes[name] = node
    return node


def _record(ev: Any, prog: Any, e: S.Call, kwargs: dict) -> Any:
    cls = e.target
    names = tuple(cls.__dataclass_fields__)
    if set(kwargs) != set(names):
        raise ev.fail(prog, e.line, f"record {cls.__name__} needs exactly the fields {names}")
    if any(shape(v) != "scalar" and as_rec(v) is None and not isinstance(v, tuple) for v in kwargs.values()):
        raise ev.fail(prog, e.line, f"record {cls.__name__}: fields must be scalars, tuples or records")
    r = Rec(cls, tuple((n, kwargs[n]) for n in names))
    return materialize(r) if is_static(r) else r


def _inline(ev: Any, prog: Any, e: S.Call, args: list, kwargs: dict, pc: Any) -> Any:
    callee = e.target
    if callee in ev.stack or len(ev.stack) >= _MAX_DEPTH:
        raise ev.fail(prog, e.line, f"recursive call to selection {callee.name} is not allowed")
    names = [p.name for p in callee.params]
    if len(args) > len(names):
        raise ev.fail(prog, e.line, f"{callee.name}() takes {len(names)} arguments, got {len(args)}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise ev.fail(prog, e.line, f"{callee.name}(): unexpected or repeated argument '{k}'")
        bound[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise ev.fail(prog, e.line, f"{callee.name}() is missing arguments {missing}")
    ev.stack.append(callee)
    try:
        c, v = ev.block(callee, callee.body, bound, pc)
    finally:
        ev.stack.pop()
    if c is True:
        return v
    if c is False:
        return None
    return ev.merge(c, v, None, callee, callee.line)
