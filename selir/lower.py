"""Lowering (stage 3): the specialized program as one dependence graph.

Vertices are the non-constant values that selection points or conditions read; edges go from an
operand to its user. A `select` reads its condition through a control edge, so a batch-dependent
branch makes everything it chooses between batch-dependent too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from detent_rl.selir.errors import SelIRError
from detent_rl.selir.graph import Node

BATCH_KINDS = ("Runtime", "Unpinnable")


@dataclass
class DepGraph:
    nodes: dict[int, Node]  # id -> node, every value the selection or its conditions read
    users: dict[int, list[int]]
    control: set[tuple[int, int]]  # (condition, select) edges
    points: dict[str, Any]  # selection point name -> Node or constant
    conditions: list  # Cond, guarded
    batch_dependent: set[int]
    schedule: frozenset = frozenset()  # selection points declared bit-neutral (never cut sinks)

    @property
    def sources(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.op == "input" and n.aux[1] in BATCH_KINDS]

    def point_nodes(self, batch_only: bool = False) -> dict[str, Node]:
        """Selection points that are values; `batch_only`: those that read the batch and must be made
        invariant (a declared schedule point may read it)."""
        return {k: v for k, v in self.points.items() if isinstance(v, Node)
                and (not batch_only or (v.id in self.batch_dependent and k not in self.schedule))}

    @property
    def edge_count(self) -> int:
        return sum(len(u) for u in self.users.values())


def reachable(roots: list, stop: Callable[[Node], bool] = lambda n: False) -> dict[int, Node]:
    """Every node the roots read, by id; the operands of nodes where `stop` holds are not followed."""
    seen: dict[int, Node] = {}
    stack = [r for r in roots if isinstance(r, Node)]
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen[n.id] = n
        if not stop(n):
            stack.extend(n.operands)
    return seen


def lower(spec: Any) -> DepGraph:
    roots = [v for v in spec.outputs.values() if isinstance(v, Node)]
    roots += [c.value for c in spec.conditions if isinstance(c.value, Node)]
    nodes = reachable(roots)
    users: dict[int, list[int]] = {i: [] for i in nodes}
    control: set[tuple[int, int]] = set()
    for n in sorted(nodes.values(), key=lambda n: n.id):
        for i, a in enumerate(n.args):
            if isinstance(a, Node) and n.id not in users[a.id]:
                users[a.id].append(n.id)
                if n.op == "select" and i == 0:
                    control.add((a.id, n.id))
    dep: set[int] = set()
    for n in sorted(nodes.values(), key=lambda n: n.id):  # ids are a topological order
        if (n.op == "input" and n.aux[1] in BATCH_KINDS) or any(a.id in dep for a in n.operands):
            dep.add(n.id)
    program = spec.program
    schedule = frozenset(p for p in spec.outputs if program.is_schedule(p))
    unmatched = [s for s in program.schedule if not any(p == s or p.startswith((s + ".", s + "["))
                                                         for p in spec.outputs)]
    if unmatched:
        raise SelIRError(f"selection {program.name} declares schedule {unmatched} but returns no such value; "
                         f"it returns {sorted(spec.outputs)}", file=program.file, line=program.line)
    return DepGraph(nodes, users, control, dict(spec.outputs), list(spec.conditions), dep, schedule)
