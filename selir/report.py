"""The solver report: what the full analysis buys over constant folding alone and over no cut."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from detent_rl.selir.cache import JITCache
from detent_rl.selir.program import Program
from detent_rl.selir.solver import analyze, solve


@dataclass
class ReportRow:
    program: str
    deployment: str
    values: int
    control_edges: int
    selection_points: int
    batch_dependent_points: list[str]
    schedule_points: list[str]
    pins_full: list[str]
    pins_fold: list[str]
    pins_none: list[str]
    values_fold: int
    candidates: int
    legal: int
    points_tried: int
    exhaustive: bool
    default: dict
    seconds: float
    cached: bool


def report_row(program: Program, deployment: str, facts: dict, cache: Optional[JITCache] = None) -> ReportRow:
    t0 = time.perf_counter()
    sol = solve(program, facts, cache=cache)
    seconds = time.perf_counter() - t0
    _, g_fold, pins_fold, _ = analyze(program, facts, level="fold", cut="min")
    _, _, pins_none, _ = analyze(program, facts, level="full", cut="none")
    s = sol.stats
    return ReportRow(
        program=program.name, deployment=deployment, values=s["values"],
        control_edges=s["control_edges"], selection_points=s["selection_points"],
        batch_dependent_points=list(s["batch_dependent_points"]),
        schedule_points=list(s.get("schedule_points", ())), pins_full=list(s["pins"]),
        pins_fold=list(pins_fold), pins_none=list(pins_none), values_fold=len(g_fold.nodes),
        candidates=s["candidate_count"], legal=s["legal_count"], points_tried=s["points_tried"],
        exhaustive=s["points_exhaustive"],
        default=dict(zip(sol.axes, sol.default)) if sol.default is not None else {},
        seconds=seconds, cached=sol.from_cache)


def render(rows: list[ReportRow]) -> str:
    out = []
    for r in rows:
        out += [
            f"== {r.program} on {r.deployment} ==",
            f"  values in the graph         {r.values} (constant folding alone: {r.values_fold}); "
            f"control edges {r.control_edges}",
            f"  selection points            {r.selection_points}, batch-dependent "
            f"{len(r.batch_dependent_points)}: {', '.join(r.batch_dependent_points) or '-'}"
            + (f"; schedule (bit-neutral, may read the batch) {len(r.schedule_points)}" if r.schedule_points else ""),
            f"  pins, full analysis         {len(r.pins_full)}: {', '.join(r.pins_full) or '-'}",
            f"  pins, constant folding only {len(r.pins_fold)}: {', '.join(r.pins_fold) or '-'}",
            f"  pins, no cut                {len(r.pins_none)}: {', '.join(r.pins_none) or '-'}",
            f"  assignments                 {r.candidates} candidates, {r.legal} legal "
            f"({r.points_tried} input points, {'exhaustive' if r.exhaustive else 'seeded sample'})",
            f"  default tuple               {r.default or 'none legal'}",
            f"  solve                       {r.seconds * 1e3:.1f} ms ({'JIT-cache hit' if r.cached else 'cold'})",
            "",
        ]
    return "\n".join(out)
