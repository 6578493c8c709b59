"""Pin value-range analysis (stage 5): each pin's candidates and which assignments are legal.

A pin's candidates are the values it can take in the program (a finite value-set analysis; where
that is not finite, the values the unpinned program takes at the sampled inputs). An assignment of
pins and knobs is legal iff every require/assume holds at every input point tried: all points
when the inputs' domains are small, a fixed seeded sample otherwise. Conditions are grouped by the
pins and knobs they read, each group judged on the product of only its own axes, so the cost is a
sum over groups rather than a product over all pins.
Within a group each point is evaluated on demand and split into cases only on the pins and knobs
it actually reads (`selir/cases.py`): the same verdicts, without running the whole product at every point.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Optional

from detent_rl.selir import ops
from detent_rl.selir.codegen import RUNTIME_HELPERS, Emitter, lit
from detent_rl.selir.errors import SelIRError
from detent_rl.selir.graph import Node

EXHAUSTIVE_LIMIT = 4096  # input points; above this a fixed sample is used
SAMPLE_POINTS = 384
VALUE_SET_LIMIT = 4096
MAX_ASSIGNMENTS = 2_000_000


@dataclass
class Points:
    names: tuple[str, ...]
    rows: list[tuple]
    exhaustive: bool


def _pool(lo: int, hi: int, criticals: set, rng: random.Random) -> list[int]:
    vals = {lo, hi, lo + 1, hi - 1}
    k = 1
    while k <= hi:
        vals.update((k - 1, k, k + 1))
        k *= 2
    for c in criticals:
        if isinstance(c, (int, float)) and math.isfinite(c):
            vals.update((math.floor(c) - 1, math.floor(c), math.ceil(c), math.ceil(c) + 1))
    vals.update(rng.randint(lo, hi) for _ in range(16))
    return sorted(v for v in vals if lo <= v <= hi)


def _axis(name: str, type_: str, domain: tuple) -> tuple:
    lo, hi, values = domain
    if values is not None:
        return ("set", list(values))
    if type_ == "bool":
        return ("set", [False, True])
    if lo is None or not (math.isfinite(lo) and math.isfinite(hi)):
        raise SelIRError(f"batch-dependent input '{name}' has no finite range: state one with "
                         f"assume(lo <= {name} <= hi) so VRA can judge assignments")
    return ("int", int(lo), int(hi)) if type_ == "int" else ("float", lo, hi)


def input_points(names: list[str], types: dict, domains: dict, criticals: set, seed: int,
                 keep: Any = None) -> Points:
    """All points of small domains, else a fixed seeded sample; `keep` filters rows in bulk."""
    axes = [_axis(n, types[n], domains.get(n, (None, None, None))) for n in names]
    sizes = [len(a[1]) if a[0] == "set" else a[2] - a[1] + 1 if a[0] == "int" else math.inf for a in axes]
    if math.prod(sizes) <= EXHAUSTIVE_LIMIT:
        full = [a[1] if a[0] == "set" else list(range(a[1], a[2] + 1)) for a in axes]
        rows = list(itertools.product(*full))
        return Points(tuple(names), keep(rows) if keep else rows, True)
    rng = random.Random(seed)
    pools = []
    for a in axes:
        if a[0] == "int":
            pools.append(_pool(a[1], a[2], criticals, rng))
        elif a[0] == "float":
            pools.append(sorted({a[1], a[2], *(c for c in criticals if a[1] <= c <= a[2])}))
        else:
            pools.append(a[1])
    rows: set = set()
    for attempt in range(32):
        batch = [tuple(p[0] for p in pools), tuple(p[-1] for p in pools)] if attempt == 0 else []
        batch += [_draw(axes, pools, rng) for _ in range(SAMPLE_POINTS)]
        rows.update(keep(batch) if keep else batch)
        if len(rows) >= SAMPLE_POINTS:
            break
    return Points(tuple(names), sorted(rows, key=repr)[:SAMPLE_POINTS * 2], False)


def _draw(axes: list, pools: list, rng: random.Random) -> tuple:
    row = []
    for a, pool in zip(axes, pools):
        if a[0] == "int" and rng.random() < 0.3:
            row.append(rng.randint(a[1], a[2]))
        elif a[0] == "float" and rng.random() < 0.5:
            row.append(rng.uniform(a[1], a[2]))
        else:
            row.append(rng.choice(pool))
    return tuple(row)


def value_set(n: Any, cache: dict, domains: dict) -> Optional[frozenset]:
    """The finite set of values node `n` can take, or None when unknown or too large."""
    if not isinstance(n, Node):
        return frozenset([n])
    if n.id in cache:
        return cache[n.id]
    cache[n.id] = None  # guards against re-entry; the graph is acyclic
    out: Optional[frozenset] = None
    if n.op == "input":
        lo, hi, values = domains.get(n.aux[0], (None, None, None))
        if values is not None:
            out = frozenset(values)
        elif n.type == "bool":
            out = frozenset([False, True])
        elif n.type == "int" and lo is not None and math.isfinite(hi - lo) and hi - lo < VALUE_SET_LIMIT:
            out = frozenset(range(int(lo), int(hi) + 1))
    elif n.op == "knob":
        out = frozenset(n.aux[1])
    elif n.op == "lookup":
        out = frozenset(n.aux[1])
    elif n.op == "nearest":
        out = frozenset(n.aux)
    elif n.op in ops.COMPARISONS or n.op in ("not", "truth", "member"):
        out = frozenset([False, True])
    elif n.op == "select":
        a, b = value_set(n.args[1], cache, domains), value_set(n.args[2], cache, domains)
        out = a | b if a is not None and b is not None and len(a | b) <= VALUE_SET_LIMIT else None
    else:
        sets = [value_set(a, cache, domains) for a in n.args]
        if all(s is not None for s in sets) and math.prod(len(s) for s in sets) <= VALUE_SET_LIMIT * 4:
            vals = {ops.apply(n.op, combo, n.aux) for combo in itertools.product(*sets)}
            out = frozenset(vals) if len(vals) <= VALUE_SET_LIMIT else None
    cache[n.id] = out
    return out


def sort_values(vals: Any) -> tuple:
    return tuple(sorted(vals, key=lambda v: (type(v).__name__, v)))


def compile_probe(roots: list, pinned: dict[int, str], knobs: dict[str, str], inputs: tuple[str, ...],
                  params: tuple[str, ...], mode: str) -> Any:
    """Generated loop over input points: `probe` returns node values, `check` the first failure."""
    em = Emitter(pinned, knobs)
    lines = em.lines(roots, indent="        ")
    unpack = ", ".join(inputs) + ("," if len(inputs) == 1 else "")
    src = em.prelude() + [f"def run({', '.join(params + ('points',))}):"]
    if mode == "probe":
        src += ["    out = []", f"    for {unpack or '_'} in points:" if inputs else "    for _ in points:", *lines,
                f"        out.append(({''.join(_code(r, pinned) + ', ' for r in roots)}))", "    return out"]
    else:
        src += [f"    for i, {('(' + unpack + ')') if inputs else '_'} in enumerate(points):", *lines]
        src += [f"        if not {_code(r, pinned)}: return ({k}, i)" for k, r in enumerate(roots)]
        src += ["    return None"]
    ns = dict(RUNTIME_HELPERS)
    exec(compile("\n".join(src), f"<vra {mode}>", "exec"), ns)
    return ns["run"]


def _code(v: Any, pinned: dict) -> str:
    if isinstance(v, Node):
        return pinned.get(v.id) or (v.aux[0] if v.op == "input" else f"v{v.id}")
    return lit(v)
