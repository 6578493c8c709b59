"""Judging assignments (the second half of VRA): legal sets and witnesses for rejections."""
from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from detent_rl.selir.cases import CaseJudge
from detent_rl.selir.codegen import lit
from detent_rl.selir.errors import SelIRError
from detent_rl.selir.graph import Node
from detent_rl.selir.vra import (MAX_ASSIGNMENTS, Points, compile_probe, input_points, sort_values,
                                 value_set)


@dataclass
class Verdict:
    axes: tuple[str, ...]  # pin names, then knob names
    candidates: dict[str, tuple]
    candidate_source: dict[str, str]  # "analysis" | "observed" | "knob"
    candidate_count: int
    groups: list  # (axis positions, {projection: (condition index, input point)}) per condition group
    points: Points
    observed: dict[str, Counter] = field(default_factory=dict)


def _deps(root: Any, pin_ids: dict[int, str]) -> tuple[frozenset, frozenset]:
    """The pins and knobs a condition reads (its slice stops at pins)."""
    pins, knobs, seen = set(), set(), set()
    stack = [root] if isinstance(root, Node) else []
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.id in pin_ids:
            pins.add(pin_ids[n.id])
        elif n.op == "knob":
            knobs.add(n.aux[0])
        else:
            stack.extend(n.operands)
    return frozenset(pins), frozenset(knobs)


def judge(g: Any, pins: dict[str, Node], knobs: dict[str, tuple], domains: dict, types: dict,
          seed: int = 0) -> Verdict:
    pin_ids = {n.id: name for name, n in pins.items()}
    inputs = sorted({n.aux[0] for n in g.sources} | {n.aux[0] for n in g.nodes.values()
                                                     if n.op == "input"})
    criticals = {a for n in g.nodes.values() if n.op in ("lt", "le", "gt", "ge", "eq", "ne")
                 for a in n.args if not isinstance(a, Node) and type(a) in (int, float)}
    conds = g.conditions
    deps = [_deps(c.value, pin_ids) for c in conds]
    # input-only assumes describe the domain: points outside it are not inputs at all
    domain_ix = [i for i, (p, k) in enumerate(deps) if not p and not k and conds[i].kind == "assume"]
    in_domain = None
    if domain_ix:
        probe = compile_probe([conds[i].value for i in domain_ix], {}, {}, tuple(inputs), (), "probe")
        in_domain = lambda rows: [r for r, ok in zip(rows, probe(rows)) if all(ok)]  # noqa: E731
    pts = input_points(inputs, types, domains, criticals, seed, in_domain)
    if not pts.rows:
        raise SelIRError("no input point satisfies the program's assumes; check its assume(...)s")

    # candidates: value-set analysis, else the values the unpinned program takes on the points
    vs_cache: dict = {}
    cands, source = {}, {}
    probe_nodes = list(pins.values())
    observed_vals = compile_probe(probe_nodes, {}, {k: lit(v[1]) for k, v in knobs.items()},
                                  pts.names, (), "probe")(pts.rows)
    observed = {name: Counter(row[i] for row in observed_vals) for i, name in enumerate(pins)}
    for name, node in pins.items():
        vs = value_set(node, vs_cache, domains)
        if vs is not None and node.range is not None:
            # the value-set analysis drops correlations between operands; the node's interval (what
            # the specializer simplified conditions with) excludes values it can never take
            lo, hi = node.range
            vs = frozenset(v for v in vs if not isinstance(v, (int, float)) or lo <= v <= hi)
        cands[name], source[name] = (sort_values(vs), "analysis") if vs is not None else \
            (sort_values(observed[name]), "observed")
    for k, (choices, _) in knobs.items():
        cands[k], source[k] = tuple(choices), "knob"
    axes = tuple(pins) + tuple(knobs)
    total = math.prod(len(cands[a]) for a in axes)

    # judge each group of conditions on the product of its own pins and knobs only
    groups: dict[tuple, list[int]] = {}
    for i, (p, k) in enumerate(deps):
        if i not in domain_ix:
            groups.setdefault(tuple(a for a in axes if a in p or a in k), []).append(i)
    tables = []
    for gaxes, idx in groups.items():
        size = math.prod(len(cands[a]) for a in gaxes)
        if size > MAX_ASSIGNMENTS:
            raise SelIRError(f"conditions {[conds[i].describe() for i in idx]} read {gaxes}, whose "
                             f"{size} joint candidates exceed the limit {MAX_ASSIGNMENTS}; state "
                             "tighter assumes or split the condition")
        case_judge = CaseJudge([conds[i].value for i in idx], gaxes, {pins[a].id: a for a in gaxes if a in pins},
                               {k: v[1] for k, v in knobs.items() if k not in gaxes}, pts.names)
        table = case_judge.table(pts.rows, cands, idx, lambda: plain_table(conds, idx, gaxes, pins, knobs, cands, pts))
        tables.append(([axes.index(a) for a in gaxes], table))

    v = Verdict(axes, cands, source, total, tables, pts, observed)
    return v


def plain_table(conds: list, idx: list[int], gaxes: tuple, pins: dict[str, Node], knobs: dict[str, tuple],
                cands: dict[str, tuple], pts: Points) -> dict:
    """A group's rejections by the compiled check, run once per assignment over every point (the
    reference `CaseJudge` must equal, and its fallback)."""
    params = tuple(f"_a{j}" for j in range(len(gaxes)))
    pinned = {pins[a].id: p for a, p in zip(gaxes, params) if a in pins}
    kn = {a: p for a, p in zip(gaxes, params) if a in knobs}
    kn.update({k: lit(v[1]) for k, v in knobs.items() if k not in kn})
    check = compile_probe([conds[i].value for i in idx], pinned, kn, pts.names, params, "check")
    table = {}
    for combo in itertools.product(*(cands[a] for a in gaxes)):
        r = check(*combo, pts.rows)
        if r is not None:
            table[combo] = (idx[r[0]], pts.rows[r[1]])
    return table


def why_illegal(groups: list, assignment: tuple) -> tuple | None:
    """(condition index, input point) for the first group that rejects the assignment."""
    for pos, table in groups:
        bad = table.get(tuple(assignment[j] for j in pos)) if table else None
        if bad is not None:
            return bad
    return None


def enumerate_legal(axes: tuple, candidates: dict, groups: list) -> list[tuple]:
    total = math.prod(len(candidates[x]) for x in axes)
    if total > MAX_ASSIGNMENTS:
        raise SelIRError(f"{total} candidate assignments are too many to enumerate "
                         f"(limit {MAX_ASSIGNMENTS}); legality of a given tuple is still checked")
    return [a for a in itertools.product(*(candidates[x] for x in axes)) if why_illegal(groups, a) is None]


def default_assignment(v: Verdict, knobs: dict[str, tuple], legal: list[tuple]) -> tuple | None:
    """Each pin's most frequent unpinned value, each knob's default; else the nearest legal tuple."""
    if not legal:
        return None
    want = tuple([v.observed[a].most_common(1)[0][0] if v.observed.get(a) else None
                  for a in v.axes if a not in knobs] + [knobs[k][1] for k in knobs])
    if why_illegal(v.groups, want) is None and want in set(legal):
        return want
    return max(legal, key=lambda a: sum(x == w for x, w in zip(a, want)))
