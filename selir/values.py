"""Structured values of the partial evaluator: records with symbolic fields, and their merges.

Scalars are Python constants or graph Nodes; tuples, dicts and records hold scalars. Structures are
split into scalars (scalar replacement of aggregates), so every selection point is one graph value.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from detent_rl.selir.graph import Node
from detent_rl.selir.lang import is_record


@dataclass(frozen=True)
class Rec:
    """A record whose fields may be symbolic."""
    cls: type
    items: tuple[tuple[str, Any], ...]

    def get(self, name: str) -> Any:
        for k, v in self.items:
            if k == name:
                return v
        raise KeyError(name)


def as_rec(v: Any) -> Rec | None:
    if isinstance(v, Rec):
        return v
    if is_record(v):
        return Rec(type(v), tuple((f.name, getattr(v, f.name)) for f in fields(v)))
    return None


def shape(v: Any) -> Any:
    """A structure's shape: equal shapes can be merged leaf by leaf."""
    r = as_rec(v)
    if r is not None:
        return ("rec", r.cls, tuple((k, shape(x)) for k, x in r.items))
    if isinstance(v, tuple):
        return ("tuple", tuple(shape(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((k, shape(x)) for k, x in v.items()))
    return "scalar"


def zip_leaves(fn: Callable[..., Any], *vals: Any) -> Any:
    """Apply `fn` to corresponding scalar leaves of equally shaped structures."""
    first = vals[0]
    if shape(first) == "scalar":
        return fn(*vals)
    recs = [as_rec(v) for v in vals]
    if recs[0] is not None:
        items = tuple((k, zip_leaves(fn, *(r.items[i][1] for r in recs)))
                      for i, (k, _) in enumerate(recs[0].items))
        return Rec(recs[0].cls, items)
    if isinstance(first, tuple):
        return tuple(zip_leaves(fn, *(v[i] for v in vals)) for i in range(len(first)))
    return {k: zip_leaves(fn, *(v[k] for v in vals)) for k in first}


def flatten(v: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a returned structure named by their path (`row.BLOCK_SIZE_M`, `tiles[0]`)."""
    r = as_rec(v)
    if r is not None:
        pairs = [(f"{prefix}.{k}" if prefix else k, x) for k, x in r.items]
    elif isinstance(v, dict):
        pairs = [(f"{prefix}.{k}" if prefix else str(k), x) for k, x in v.items()]
    elif isinstance(v, tuple):
        pairs = [(f"{prefix}[{i}]", x) for i, x in enumerate(v)]
    else:
        return {prefix or "value": v}
    out: dict[str, Any] = {}
    for name, x in pairs:
        out.update(flatten(x, name))
    return out


def is_static(v: Any) -> bool:
    if isinstance(v, Node):
        return False
    r = as_rec(v)
    if r is not None:
        return all(is_static(x) for _, x in r.items)
    if isinstance(v, tuple):
        return all(is_static(x) for x in v)
    if isinstance(v, dict):
        return all(is_static(x) for x in v.values())
    return True


def materialize(v: Any) -> Any:
    """Turn a static Rec back into its record instance."""
    if isinstance(v, Rec):
        return v.cls(**{k: materialize(x) for k, x in v.items})
    if isinstance(v, tuple):
        return tuple(materialize(x) for x in v)
    return v
