"""The solver pipeline: parse → specialize → lower → cut → VRA → (compile on commit) → JIT cache."""
from __future__ import annotations

import hashlib
import time
from typing import Any, Optional

from detent_rl.selir.cache import JITCache, cache_key
from detent_rl.selir.cut import min_cut, trivial_cut
from detent_rl.selir.graph import Node
from detent_rl.selir.ops import SYMBOL
from detent_rl.selir.legal import default_assignment, judge
from detent_rl.selir.vra import MAX_ASSIGNMENTS
from detent_rl.selir.lower import DepGraph, lower
from detent_rl.selir.program import Program, canonical
from detent_rl.selir.solution import Solution
from detent_rl.selir.specialize import specialize

CUTS = ("min", "none")


def pin_names(g: DepGraph, pins: tuple[Node, ...], names: dict[int, str]) -> dict[str, Node]:
    """Name each pin after the selection point it is, else the program variable bound to it."""
    out: dict[str, Node] = {}
    by_point = {}
    for p, v in g.points.items():
        if isinstance(v, Node):
            by_point.setdefault(v.id, p)
    for n in pins:
        base = by_point.get(n.id) or names.get(n.id) or describe(n, names)
        name, i = base, 2
        while name in out:
            name, i = f"{base}#{i}", i + 1
        out[name] = n
    return out


def describe(n: Any, names: dict[int, str], depth: int = 2) -> str:
    """A short expression for an unnamed value, e.g. `max_seqlen_q == 1`."""
    if not isinstance(n, Node):
        return repr(n)
    if n.op in ("input", "knob"):
        return n.aux[0]
    if n.id in names:
        return names[n.id]
    if depth == 0:
        return f"%{n.id}"
    args = [describe(a, names, depth - 1) for a in n.args]
    if n.op in SYMBOL and len(args) == 2:
        return f"{args[0]} {SYMBOL[n.op]} {args[1]}"
    if n.op == "not":
        return f"not {args[0]}"
    return f"{n.op}({', '.join(args)})"


def domains_of(spec: Any) -> dict[str, tuple]:
    out = {}
    for name in spec.inputs:
        lo, hi = spec.input_ranges.get(name, (None, None))
        values = spec.input_domains.get(name)
        if values is not None and spec.input_types[name] == "bool":
            values = None if set(values) == {False, True} else values
        if lo is not None or values is not None:
            out[name] = (lo, hi, values)
    return out


def ir_hash(g: DepGraph) -> str:
    h = hashlib.sha256()
    for i in sorted(g.nodes):
        n = g.nodes[i]
        h.update(f"{n.id}:{n.op}:{canonical(tuple(a.id if isinstance(a, Node) else ('c', a) for a in n.args))}:"
                 f"{canonical(n.aux)};".encode())
    h.update(canonical({k: (v.id if isinstance(v, Node) else v) for k, v in g.points.items()}).encode())
    return h.hexdigest()[:16]


def analyze(program: Program, facts: dict, *, level: str = "full", cut: str = "min") -> tuple:
    """Stages 2–4 only: the specialized program, its dependence graph and the named pins."""
    if cut not in CUTS:
        raise ValueError(f"cut must be one of {CUTS}, got {cut!r}")
    spec = specialize(program, facts, level)
    g = lower(spec)
    if cut == "min":
        c = min_cut(g)
        pins, value = c.pins, c.value
    else:
        pins, value = trivial_cut(g), None
    return spec, g, pin_names(g, pins, spec.builder.names), value


def solve(program: Program, facts: dict, *, level: str = "full", cut: str = "min", seed: int = 0,
          cache: Optional[JITCache] = None) -> Solution:
    """Solve a program for a deployment. A JIT-cache hit skips every stage."""
    key = cache_key(program, facts, level=level, cut=cut, seed=seed)
    cache = cache if cache is not None else JITCache.default()
    hit = cache.load(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    spec, g, named, cut_value = analyze(program, facts, level=level, cut=cut)
    domains = domains_of(spec)
    verdict = judge(g, named, spec.knobs, domains, spec.input_types, seed)
    stats = {
        "values": len(g.nodes), "edges": g.edge_count, "control_edges": len(g.control),
        "selection_points": len(g.points),
        "batch_dependent_points": tuple(sorted(g.point_nodes(batch_only=True))),
        "schedule_points": tuple(sorted(g.schedule)),
        "batch_inputs": tuple(sorted(n.aux[0] for n in g.sources)),
        "pins": tuple(named), "cut_value": cut_value,
        "candidate_count": verdict.candidate_count, "legal_count": None,
        "points_tried": len(verdict.points.rows), "points_exhaustive": verdict.points.exhaustive,
        "point_names": tuple(verdict.points.names),
        "solve_seconds": None,
    }
    sol = Solution(
        program_name=program.name, program_file=program.file, program_line=program.line,
        ir_hash=ir_hash(g), level=level, facts_text=canonical(dict(sorted(facts.items()))),
        params=tuple(p.name for p in program.batch_inputs), domains=domains,
        outputs=dict(g.points), conditions=list(g.conditions), pin_nodes=named,
        knobs=dict(spec.knobs), axes=verdict.axes, candidates=verdict.candidates,
        candidate_source=verdict.candidate_source, groups=verdict.groups, default=None, stats=stats)
    if verdict.candidate_count <= MAX_ASSIGNMENTS:
        sol.default = default_assignment(verdict, spec.knobs, sol.legal)
        stats["legal_count"] = len(sol.legal)
    stats["solve_seconds"] = round(time.perf_counter() - t0, 4)
    cache.store(key, sol)
    return sol
