"""Judging one condition group by case splits at each input point, instead of every assignment at every point.

The plain way (`legal.judge`'s compiled check) runs the group's conditions once per assignment of its pins
and knobs over all input points: the product of the candidates times the points. Most of that product is
never read. The matmul program's six tile knobs and its pin make 14,400 assignments, yet at any one M its
conditions read the pin, `schedule_by_m` and one bucket's knob: a select only reads the arm it takes.

Here each point is evaluated on demand, a select's condition first and then only the arm it takes. Where
the evaluation reaches a pin or knob with no value yet, it splits: one case per candidate, each going on
from what was already computed. A point's leaves are partial assignments (cubes), each passing or naming
the first condition it fails. A failing cube stands for every assignment that agrees with it; those not
already rejected at an earlier point are rejected at this one. The table is the plain check's exactly:
every rejected assignment with its first failing point and, there, its first failing condition (the
operations are total, so evaluating fewer arms cannot change a value). Where a group's points split into
about as many cases as the product (conditions that read every axis everywhere), it runs the compiled
check instead: case splitting cannot win there.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

from detent_rl.selir import ops
from detent_rl.selir.graph import Node
from detent_rl.selir.lower import reachable

PROBE_POINTS = 8  # points explored before deciding whether case splitting pays for this group
# ... it does while a point's cases average at most this share of the product: a case costs 4-35 us of
# Python, an assignment at a point 0.06-1.2 us of the compiled check (attention's and matmul's groups)
MAX_LEAF_SHARE = 1 / 64


class TooManyCases(Exception):
    """A point's (or a set of points') case tree would pass the caller's limit."""


class _Need(Exception):
    def __init__(self, axis: str) -> None:
        self.axis = axis


class CaseJudge:
    """One condition group: its roots, its axes (pins by node, knobs by name) and the fixed inputs."""

    def __init__(self, roots: list, axes: tuple[str, ...], pin_axes: dict[int, str], knob_defaults: dict[str, Any],
                 input_names: tuple[str, ...]) -> None:
        self.roots = roots
        self.axes = axes
        self.pin_axes = pin_axes  # node id -> axis name, for the group's pins
        self.knob_defaults = knob_defaults  # knobs outside the group's axes: their defaults
        self.input_names = input_names
        self.input_nodes: dict[str, list[int]] = {}
        self.knob_nodes: dict[str, list[int]] = {}
        for n in reachable(roots, stop=lambda n: n.id in pin_axes).values():
            if n.op in ("input", "knob") and n.id not in pin_axes:
                (self.input_nodes if n.op == "input" else self.knob_nodes).setdefault(n.aux[0], []).append(n.id)
        self.axis_nodes = {a: [i for i, name in pin_axes.items() if name == a] + self.knob_nodes.get(a, [])
                           for a in axes}

    def _eval(self, root: Any, memo: dict) -> Any:
        if not isinstance(root, Node):
            return root
        stack = [root]
        while stack:
            n = stack[-1]
            if n.id in memo:
                stack.pop()
                continue
            if n.id in self.pin_axes:
                raise _Need(self.pin_axes[n.id])
            if n.op == "knob":
                raise _Need(n.aux[0])
            args = n.args
            if n.op == "select":  # the condition, then only the arm it takes
                c = args[0]
                if isinstance(c, Node) and c.id not in memo:
                    stack.append(c)
                    continue
                arm = args[1] if (memo[c.id] if isinstance(c, Node) else c) else args[2]
                if isinstance(arm, Node):
                    if arm.id not in memo:
                        stack.append(arm)
                        continue
                    memo[n.id] = memo[arm.id]
                else:
                    memo[n.id] = arm
                stack.pop()
                continue
            pending = [a for a in args if isinstance(a, Node) and a.id not in memo]
            if pending:
                stack.extend(pending)
                continue
            memo[n.id] = ops.apply(n.op, tuple(memo[a.id] if isinstance(a, Node) else a for a in args), n.aux)
            stack.pop()
        return memo[root.id]

    def _start(self, row: tuple) -> dict[int, Any]:
        memo: dict[int, Any] = {}
        for name, value in zip(self.input_names, row):
            for i in self.input_nodes.get(name, ()):
                memo[i] = value
        for name, value in self.knob_defaults.items():
            for i in self.knob_nodes.get(name, ()):
                memo[i] = value
        return memo

    def _split(self, memo: dict, axis: str, value: Any) -> dict:
        m = dict(memo)  # what was computed before the split holds in every case
        for i in self.axis_nodes[axis]:
            m[i] = value
        return m

    def leaves(self, row: tuple, candidates: dict[str, tuple],
               max_leaves: Optional[int] = None) -> list[tuple[dict, Optional[int]]]:
        """The point's cases: (partial assignment, index of the first failing root or None); TooManyCases
        past `max_leaves`."""
        out: list[tuple[dict, Optional[int]]] = []
        work = [(self._start(row), {})]
        while work:
            memo, assigned = work.pop()
            try:
                fail = next((k for k, r in enumerate(self.roots) if not self._eval(r, memo)), None)
            except _Need as need:
                for v in reversed(candidates[need.axis]):
                    work.append((self._split(memo, need.axis, v), {**assigned, need.axis: v}))
                continue
            out.append((assigned, fail))
            if max_leaves is not None and len(out) > max_leaves:
                raise TooManyCases(f"a point splits into more than {max_leaves} cases")
        return out

    def tree(self, row: tuple, candidates: dict[str, tuple], max_leaves: Optional[int] = None) -> tuple[Any, int]:
        """Every root's value at the point, as a tree of cases, and how many cases it holds: a leaf is the
        tuple of values, a split is (axis, {candidate: subtree}); `lookup` finds an assignment's leaf.
        TooManyCases past `max_leaves`."""
        count = 0

        def explore(memo: dict) -> Any:
            nonlocal count
            try:
                leaf = _Leaf(tuple(self._eval(r, memo) for r in self.roots))
            except _Need as need:
                return need.axis, {v: explore(self._split(memo, need.axis, v)) for v in candidates[need.axis]}
            count += 1
            if max_leaves is not None and count > max_leaves:
                raise TooManyCases(f"a point splits into more than {max_leaves} cases")
            return leaf
        return explore(self._start(row)), count

    def table(self, rows: list[tuple], candidates: dict[str, tuple], cond_index: list[int],
              fallback: Callable[[], dict]) -> dict:
        """{rejected assignment: (condition index, point)}, as the compiled check over the product gives it."""
        size = 1
        for a in self.axes:
            size *= len(candidates[a])
        found: dict[tuple, tuple] = {}
        covered: list[dict] = []  # failing cubes already recorded: every assignment in them is in `found`
        leaves = 0
        budget = MAX_LEAF_SHARE * size * PROBE_POINTS  # the probe's cases, all told
        for i, row in enumerate(rows):
            try:  # the probe stops as soon as its points pass the budget (a first point may split whole)
                cases = self.leaves(row, candidates, budget - leaves if i < PROBE_POINTS else None)
            except TooManyCases:
                return fallback()
            leaves += len(cases)
            for assigned, k in cases:
                if k is None or any(c.items() <= assigned.items() for c in covered):
                    continue
                free = [a for a in self.axes if a not in assigned]
                for combo in itertools.product(*(candidates[a] for a in free)):
                    full = dict(assigned, **dict(zip(free, combo)))
                    found.setdefault(tuple(full[a] for a in self.axes), (cond_index[k], row))
                covered.append(assigned)
        order = {a: {v: j for j, v in enumerate(candidates[a])} for a in self.axes}
        return {c: found[c] for c in sorted(found, key=lambda c: tuple(order[a][v] for a, v in zip(self.axes, c)))}


class _Leaf(tuple):
    pass


def lookup(tree: Any, assignment: dict[str, Any]) -> tuple:
    """The root values a `CaseJudge.tree` gives for a full assignment (axis -> value)."""
    while not isinstance(tree, _Leaf):
        axis, cases = tree
        tree = cases[assignment[axis]]
    return tuple(tree)
