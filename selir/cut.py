"""The cut (stage 4): the fewest values to pin so no batch-dependent input reaches a selection point.

Weights: every pinnable value costs `big + distance to the nearest batch-dependent selection
point`, with `big` larger than any sum of distances, so a minimum cut has the fewest pins first
and, among those, pins nearest the selection points. Unpinnable inputs cost infinity.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from detent_rl.selir.errors import SelIRError
from detent_rl.selir.flow import INF, min_vertex_cut
from detent_rl.selir.graph import Node
from detent_rl.selir.lower import DepGraph


@dataclass(frozen=True)
class Cut:
    pins: tuple[Node, ...]
    value: float  # the max-flow value, equal to the pins' total cost
    costs: dict  # node id -> cost, for the vertices that took part


def distances_to_points(g: DepGraph) -> dict[int, int]:
    """Shortest number of edges from each node to a batch-dependent selection point."""
    dist: dict[int, int] = {}
    q: deque[int] = deque()
    for n in g.point_nodes(batch_only=True).values():
        if n.id not in dist:
            dist[n.id] = 0
            q.append(n.id)
    preds: dict[int, list[int]] = {i: [] for i in g.nodes}
    for u, vs in g.users.items():
        for v in vs:
            preds[v].append(u)
    while q:
        v = q.popleft()
        for u in preds[v]:
            if u not in dist:
                dist[u] = dist[v] + 1
                q.append(u)
    return dist


def cost_of(n: Node, dist: int, big: int) -> float:
    if n.op == "input" and n.aux[1] == "Unpinnable":
        return INF
    return big + dist


def min_cut(g: DepGraph) -> Cut:
    for name, n in g.point_nodes(batch_only=True).items():
        if n.op == "input" and n.aux[1] == "Unpinnable":
            raise SelIRError(f"selection point '{name}' is the Unpinnable input '{n.aux[0]}' itself: "
                             "nothing can be pinned to make it batch-invariant")
    dist = distances_to_points(g)
    relevant = [i for i in g.batch_dependent if i in dist]  # on some batch -> point path
    big = (max(dist.values(), default=0) + 1) * (len(relevant) + 1)
    costs = {i: cost_of(g.nodes[i], dist[i], big) for i in relevant}
    rel = set(relevant)
    edges = [(u, v) for u in relevant for v in g.users[u] if v in rel]
    sources = [n.id for n in g.sources if n.id in rel]
    sinks = [n.id for n in g.point_nodes(batch_only=True).values()]
    value, cut = min_vertex_cut(edges, costs, sources, sinks)
    return Cut(tuple(sorted((g.nodes[i] for i in cut), key=lambda n: n.id)), value, costs)


def trivial_cut(g: DepGraph) -> tuple[Node, ...]:
    """The "no cut" ablation: pin every batch-dependent selection point itself."""
    return tuple(sorted({n.id: n for n in g.point_nodes(batch_only=True).values()}.values(),
                        key=lambda n: n.id))
