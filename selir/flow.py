"""Maximum flow and minimum vertex cuts.

`max_flow` is the Edmonds–Karp algorithm (Edmonds & Karp, J. ACM 19(2), 1972): augment along
shortest residual paths found by breadth-first search. `min_vertex_cut` builds the usual
node-split graph — each vertex v becomes v_in → v_out with capacity cost(v), original edges get
infinite capacity — so a minimum s–t edge cut there is a minimum-weight vertex cut.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable

INF = float("inf")


def _max_flow_core(cap: dict, s: Hashable, t: Hashable) -> tuple[float, dict]:
    """Return the flow value and the residual capacities (cap is consumed)."""
    total = 0
    while True:
        parent = {s: None}
        q = deque([s])
        while q and t not in parent:
            u = q.popleft()
            for v, c in cap[u].items():
                if c > 0 and v not in parent:
                    parent[v] = u
                    q.append(v)
        if t not in parent:
            return total, cap
        path_cap, v = INF, t
        while parent[v] is not None:
            path_cap = min(path_cap, cap[parent[v]][v])
            v = parent[v]
        if path_cap == INF:
            raise ValueError("the minimum cut is infinite: some source reaches a sink only "
                             "through values that may not be cut")
        v = t
        while parent[v] is not None:
            u = parent[v]
            cap[u][v] -= path_cap
            cap[v][u] = cap[v].get(u, 0) + path_cap
            v = u
        total += path_cap


def max_flow(edges: Iterable[tuple[Hashable, Hashable, float]], s: Hashable, t: Hashable) -> tuple[float, set]:
    """Maximum s–t flow value and the source side of a minimum cut."""
    cap: dict = {s: {}, t: {}}
    for u, v, c in edges:
        if c < 0:
            raise ValueError(f"negative capacity on edge {u!r}->{v!r}")
        cap.setdefault(u, {})
        cap.setdefault(v, {})
        cap[u][v] = cap[u].get(v, 0) + c
        cap[v].setdefault(u, 0)
    value, residual = _max_flow_core(cap, s, t)
    side, q = {s}, deque([s])
    while q:
        u = q.popleft()
        for v, c in residual[u].items():
            if c > 0 and v not in side:
                side.add(v)
                q.append(v)
    return value, side


def min_vertex_cut(edges: Iterable[tuple[Hashable, Hashable]], cost: dict[Hashable, float],
                   sources: Iterable[Hashable], sinks: Iterable[Hashable]) -> tuple[float, list]:
    """A minimum-cost set of vertices meeting every path from a source to a sink.

    Sources and sinks may themselves be cut (at their own cost); use cost INF to forbid a vertex.
    """
    S, T = ("__source__",), ("__sink__",)
    flow_edges = [((v, "in"), (v, "out"), c) for v, c in cost.items()]
    flow_edges += [((u, "out"), (v, "in"), INF) for u, v in edges]
    flow_edges += [(S, (v, "in"), INF) for v in sources]
    flow_edges += [((v, "out"), T, INF) for v in sinks]
    value, side = max_flow(flow_edges, S, T)
    cut = [v for v in cost if (v, "in") in side and (v, "out") not in side]
    return value, cut
