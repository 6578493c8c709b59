"""The cut: max-flow value equals a brute-force minimum vertex cut, and pins block every path."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from detent_rl.selir import SelectionError, SelIRError
from detent_rl.selir.cache import JITCache

from detent_rl.selir.flow import INF, max_flow, min_vertex_cut
from detent_rl.selir.solver import analyze, solve
from selir_helpers import HEADER, load_module


def _blocks(edges, removed, sources, sinks) -> bool:
    adj: dict = {}
    for u, v in edges:
        adj.setdefault(u, []).append(v)
    seen, stack = set(), [s for s in sources if s not in removed]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u in sinks:
            return False
        stack.extend(v for v in adj.get(u, []) if v not in removed)
    return True


@st.composite
def small_dags(draw):
    n = draw(st.integers(3, 8))
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if draw(st.booleans())]
    costs = {v: draw(st.sampled_from([1, 2, 3, 5, INF])) for v in range(n)}
    sources = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=2))
    sinks = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    return n, edges, costs, sorted(sources), sorted(sinks)


@settings(max_examples=300, deadline=None)
@given(small_dags())
def test_max_flow_cut_equals_brute_force_minimum(dag):
    n, edges, costs, sources, sinks = dag
    best = INF
    for k in range(n + 1):
        for removed in itertools.combinations(range(n), k):
            cost = sum(costs[v] for v in removed)
            if cost < best and _blocks(edges, set(removed), sources, set(sinks)):
                best = cost
    if best == INF:
        try:
            min_vertex_cut(edges, costs, sources, sinks)
        except ValueError as e:
            assert "infinite" in str(e)
            return
        raise AssertionError("an uncuttable graph must be reported")
    value, cut = min_vertex_cut(edges, costs, sources, sinks)
    assert value == best
    assert sum(costs[v] for v in cut) == value
    assert _blocks(edges, set(cut), sources, set(sinks))


def test_max_flow_small_known_network():
    # CLRS figure 26.1: maximum flow 23
    e = [("s", "v1", 16), ("s", "v2", 13), ("v2", "v1", 4), ("v1", "v3", 12), ("v3", "v2", 9),
         ("v2", "v4", 14), ("v4", "v3", 7), ("v3", "t", 20), ("v4", "t", 4)]
    value, side = max_flow(e, "s", "t")
    assert value == 23 and "s" in side and "t" not in side


def _program_pins_block(g, pins) -> bool:
    edges = [(u, v) for u, vs in g.users.items() for v in vs]
    sources = [n.id for n in g.sources]
    sinks = {n.id for n in g.point_nodes(batch_only=True).values()}
    return _blocks(edges, {p.id for p in pins}, sources, sinks)


def test_row_key_is_the_cut_and_pins_sit_nearest_the_points(tmp_path):
    mod = load_module(HEADER + '''
@selection
def prog(m: Unpinnable[int], scale: Runtime[int]):
    assume(1 <= m <= 64)
    assume(1 <= scale <= 4)
    mm = m * scale
    key = nearest_key(TABLE, mm)
    row = TABLE[key]
    return {"a": row.a, "b": row.b, "wide": row.a > 2}
''', tmp_path)
    spec, g, pins, value = analyze(mod.prog, {})
    # {scale} is one pin too, but `key` is nearer the selection points; {mm} and {key} tie on count
    assert list(pins) == ["key"]
    assert _program_pins_block(g, pins.values())
    spec, g, none_pins, _ = analyze(mod.prog, {}, cut="none")
    assert len(none_pins) == 3 and _program_pins_block(g, none_pins.values())


def test_control_dependence_makes_a_branch_batch_dependent(tmp_path):
    mod = load_module(HEADER + '''
@selection
def prog(n: Unpinnable[int], sms: Fact[int]):
    assume(1 <= n <= 1000)
    tile = 64
    if n > sms:
        tile = 128
    return {"tile": tile, "fixed": sms * 2}
''', tmp_path)
    spec, g, pins, _ = analyze(mod.prog, {"sms": 132})
    assert sorted(g.point_nodes(batch_only=True)) == ["tile"]
    assert g.control, "the branch condition must reach `tile` through a control edge"
    assert list(pins) == ["tile"]


def test_a_declared_schedule_may_read_the_batch_and_is_left_out_of_the_cut(tmp_path):
    body = '''
def prog(n: Unpinnable[int], split: Runtime[int]):
    assume(1 <= n <= 1000)
    assume(1 <= split <= 4)
    tile = 16
    if n > 64:
        tile = 128
    require(tile <= 256 // split, "a tile spans one chunk at most")
    return {"chunk": 256 // split, "launch": {"tile": tile, "warps": tile // 16}}
'''
    mod = load_module(HEADER + "@selection(schedule=('launch',))" + body + "\n@selection" + body.replace(
        "def prog", "def bare"), tmp_path)
    spec, g, pins, _ = analyze(mod.prog, {})
    assert g.schedule == {"launch.tile", "launch.warps"}
    assert sorted(g.point_nodes(batch_only=True)) == ["chunk"] and list(pins) == ["chunk"]
    sol = solve(mod.prog, {}, cache=JITCache(enabled=False))
    sel = sol.commit({"chunk": 128})
    assert (sel(1, 1).chunk == sel(900, 3).chunk == 128 and sel(1, 2).launch_tile == 16
            and sel(900, 2).launch_tile == 128)
    assert sel.bits(sel(900, 2)) == {"chunk": 128}
    with pytest.raises(SelectionError, match="a tile spans one chunk at most"):  # a schedule keeps its require
        sol.stock()(900, 4)
    # undeclared, `launch` is a selection point like `chunk`: the cut must pin the branch on n too
    _, g, bare_pins, _ = analyze(mod.bare, {})
    assert not g.schedule and len(bare_pins) == 2 and "chunk" in bare_pins


def test_a_request_input_is_read_per_request_and_never_cut(tmp_path):
    """A split count from the request's own length and a fixed tile (a Request input) needs no pin;
    one that also reads the batch's longest length is cut. Control: the same program with the own
    length annotated Unpinnable (batch-dependent) is cut at the count, a constant for every request."""
    body = '''
def prog(own: Request[int], longest: Unpinnable[int]):
    assume(1 <= own <= 4096)
    assume(1 <= longest <= 4096)
    assume(own <= longest)
    tile = knob("tile", (128, 256), 256)
    return {"splits": (own + tile - 1) // tile, "batch_splits": (own + longest - 1) // longest}
'''
    mod = load_module(HEADER + "@selection" + body + "\n@selection" + body.replace("def prog", "def bare").replace(
        "own: Request[int]", "own: Unpinnable[int]"), tmp_path)
    _, g, pins, _ = analyze(mod.prog, {})
    assert sorted(g.point_nodes(batch_only=True)) == ["batch_splits"] and list(pins) == ["batch_splits"]
    sel = solve(mod.prog, {}, cache=JITCache(enabled=False)).commit(knobs={"tile": 128})
    assert [sel(own, 4096).splits for own in (1, 128, 129, 1000)] == [1, 1, 2, 8]
    assert sel(1000, 1000).splits == sel(1000, 4096).splits  # the batch does not move a request's count
    _, g, bare_pins, _ = analyze(mod.bare, {})
    assert sorted(g.point_nodes(batch_only=True)) == ["batch_splits", "splits"] and "splits" in bare_pins


def test_a_schedule_naming_no_returned_value_is_refused(tmp_path):
    mod = load_module(HEADER + '''
@selection(schedule=("tiles",))
def prog(n: Unpinnable[int]):
    assume(1 <= n <= 8)
    return {"tile": n * 16}
''', tmp_path)
    with pytest.raises(SelIRError, match=r"declares schedule \['tiles'\] but returns no such value"):
        analyze(mod.prog, {})
    with pytest.raises(SelIRError, match="schedule must be a tuple"):
        load_module(HEADER + '''
@selection(schedule="tile")
def prog(n: Unpinnable[int]):
    return {"tile": n}
''', tmp_path)
