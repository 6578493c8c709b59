"""VRA: legal assignments hold everywhere tried, rejected ones carry a real witness; ranges are sound."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from detent_rl.kernels.programs import allreduce, attention, matmul, moe
from detent_rl.kernels.programs.sglang import custom_allreduce_v2, fa3, moe_config, triton_decode
from detent_rl.selir.errors import SelIRError
from detent_rl.selir import cases
from detent_rl.selir.legal import enumerate_legal, judge
from detent_rl.selir.solver import analyze, domains_of
from detent_rl.selir.vra import value_set
from selir_helpers import RandomProgram, eval_graph, load_module

SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def _check_verdict(spec, g, pins):
    v = judge(g, pins, spec.knobs, domains_of(spec), spec.input_types, seed=0)
    names = v.points.names
    conds = [c.value for c in g.conditions]
    pin_ids = [pins[a].id for a in v.axes if a in pins]
    knob_axes = [a for a in v.axes if a in spec.knobs]
    legal = enumerate_legal(v.axes, v.candidates, v.groups)
    legal_set = set(legal)
    rng = random.Random(1)
    some_legal = rng.sample(legal, min(len(legal), 12))
    some = [tuple(rng.choice(v.candidates[a]) for a in v.axes) for _ in range(40)]
    for a in some_legal + [a for a in some if a not in legal_set]:
        pinned = dict(zip(pin_ids, a[:len(pin_ids)]))
        knobs = dict(zip(knob_axes, a[len(pin_ids):]))
        if a in legal_set:  # every condition at every point tried
            for row in v.points.rows:
                assert all(eval_graph(conds, dict(zip(names, row)), knobs, pinned)), \
                    f"legal {dict(zip(v.axes, a))} violates a condition at {dict(zip(names, row))}"
        else:
            from detent_rl.selir.legal import why_illegal
            cond, point = why_illegal(v.groups, a)
            assert not eval_graph([conds[cond]], dict(zip(names, point)), knobs, pinned)[0], \
                f"witness for {dict(zip(v.axes, a))} does not violate {g.conditions[cond].describe()}"
    return v, legal


def test_vra_on_every_selection_program():
    for mod in (attention, matmul, moe, allreduce):
        spec, g, pins, _ = analyze(mod.PROGRAM, mod.REFERENCE_FACTS)
        v, legal = _check_verdict(spec, g, pins)
        assert legal, f"{mod.PROGRAM.name} has no legal assignment"
        assert len(legal) <= v.candidate_count


def _tables(spec, g, pins, monkeypatch, plain: bool) -> list:
    with monkeypatch.context() as m:
        if plain:  # every group through the compiled check over the whole product
            m.setattr(cases.CaseJudge, "table", lambda self, rows, cands, idx, fallback: fallback())
        else:  # every group through case splits, also where the judge would find the compiled check cheaper
            m.setattr(cases, "MAX_LEAF_SHARE", float("inf"))
        v = judge(g, pins, spec.knobs, domains_of(spec), spec.input_types, seed=0)
    return [(pos, list(table.items())) for pos, table in v.groups]


# the matmul program over 64 rows (exhaustive points; the product of its pin and tile knobs is 11,520), the
# second with too little shared memory for fp32's wide tiles: 57,840 assignments rejected, by knob-dependent cases
SMALL_MATMUL = dict(n=896, k=4864, max_m=64, num_sms=132, smem_bytes=232448, dtype_bytes=2)
CASES = [(mod.PROGRAM, mod.REFERENCE_FACTS) for mod in (attention, moe, allreduce, custom_allreduce_v2,
                                                          triton_decode, moe_config, fa3)]
CASES += [(matmul.PROGRAM, SMALL_MATMUL), (matmul.PROGRAM, dict(SMALL_MATMUL, smem_bytes=40_000, dtype_bytes=4))]


@pytest.mark.parametrize("program, facts", CASES, ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(CASES)])
def test_case_splits_reject_exactly_what_the_plain_check_rejects(monkeypatch, program, facts):
    """The judge's case splitting gives the compiled check's tables: the same rejected assignments, each with
    the same first failing point and condition, in the same order."""
    spec, g, pins, _ = analyze(program, facts)
    fast = _tables(spec, g, pins, monkeypatch, plain=False)
    assert fast == _tables(spec, g, pins, monkeypatch, plain=True)
    if facts.get("smem_bytes") == 40_000:
        assert sum(len(t) for _, t in fast) > 50_000  # the case was one with rejections to get right


@pytest.mark.parametrize("program, facts, split", [(matmul.PROGRAM, SMALL_MATMUL, True),
                                                    (attention.PROGRAM, attention.REFERENCE_FACTS, False)],
                         ids=["matmul", "attention"])
def test_the_judge_splits_cases_only_where_they_are_few(monkeypatch, program, facts, split):
    """Matmul's tile-knob group (14,400 assignments, ~20 cases a point) is judged by case splits; attention's
    groups split every point into their whole product, so the probe gives up within its budget of cases and
    the compiled check runs (probing the 8 points in full cost more than that check)."""
    spec, g, pins, _ = analyze(program, facts)
    counted = {"leaves": 0, "fallbacks": 0, "budget": 0.0}
    real_leaves, real_table = cases.CaseJudge.leaves, cases.CaseJudge.table

    def leaves(self, row, candidates, max_leaves=None):
        out = real_leaves(self, row, candidates, max_leaves)  # (raises past max_leaves: not counted)
        counted["leaves"] += len(out)
        return out

    def table(self, rows, candidates, idx, fallback):
        counted["budget"] += (cases.MAX_LEAF_SHARE * math.prod(len(candidates[a]) for a in self.axes)
                              * cases.PROBE_POINTS)

        def counted_fallback():
            counted["fallbacks"] += 1
            return fallback()
        return real_table(self, rows, candidates, idx, counted_fallback)
    monkeypatch.setattr(cases.CaseJudge, "leaves", leaves)
    monkeypatch.setattr(cases.CaseJudge, "table", table)
    judge(g, pins, spec.knobs, domains_of(spec), spec.input_types, seed=0)
    if split:
        assert counted["leaves"] > 1000 and counted["fallbacks"] < len(g.conditions)
    else:
        assert counted["fallbacks"] >= 3 and counted["leaves"] <= counted["budget"]


def test_vra_rejects_with_witnesses_on_attention():
    spec, g, pins, _ = analyze(attention.attention_program, attention.REFERENCE_FACTS)
    v, legal = _check_verdict(spec, g, pins)
    assert len(legal) < v.candidate_count, "some assignments must be illegal (e.g. splits that miss keys)"


@settings(max_examples=25, deadline=None, suppress_health_check=SUPPRESS)
@given(seed=st.integers(0, 2**31))
def test_vra_sound_on_random_programs(tmp_path, seed):
    mod = load_module(RandomProgram(seed).source(), tmp_path)
    try:
        spec, g, pins, _ = analyze(mod.prog, {"f": 7})
        _check_verdict(spec, g, pins)
    except SelIRError as e:
        assert "can never hold" in str(e) or "exceed the limit" in str(e) or "too many" in str(e), e
        return
    with pytest.MonkeyPatch.context() as m:  # case splits reject exactly what the compiled check rejects
        assert _tables(spec, g, pins, m, plain=False) == _tables(spec, g, pins, m, plain=True)


@settings(max_examples=40, deadline=None, suppress_health_check=SUPPRESS)
@given(seed=st.integers(0, 2**31))
def test_ranges_and_value_sets_are_sound(tmp_path, seed):
    mod = load_module(RandomProgram(seed).source(), tmp_path)
    try:
        spec, g, pins, _ = analyze(mod.prog, {"f": 7})
    except SelIRError:
        return
    nodes = sorted(g.nodes.values(), key=lambda n: n.id)
    domains = domains_of(spec)
    sets = {n.id: value_set(n, {}, domains) for n in nodes}
    rng = random.Random(seed)
    (xlo, xhi), (ylo, yhi) = RandomProgram.INPUTS["x"], RandomProgram.INPUTS["y"]
    for _ in range(60):
        p = {"x": rng.randint(xlo, xhi), "y": rng.randint(ylo, yhi), "flag": rng.random() < 0.5}
        k = {"k": rng.choice((0, 2, 5))}
        for n, val in zip(nodes, eval_graph(nodes, p, k, {})):
            lo, hi = n.range
            if isinstance(val, (int, float)) and not (isinstance(val, float) and math.isnan(val)):
                assert lo <= val <= hi, f"%{n.id} {n.op} = {val} outside {n.range}"
            if sets[n.id] is not None:
                assert val in sets[n.id], f"%{n.id} {n.op} = {val} outside its value set"


def test_path_sensitive_ranges_prove_divisors_nonzero(tmp_path):
    mod = load_module(RandomProgram(0).source().split("@selection")[0] + '''
@selection
def prog(v: Runtime[int], mode: Fact[int]):
    assume(-5 <= v <= 50)
    d = v if v > 0 else 1
    stride = knob("stride", (0, 4, 8), 0)
    q = 100 // d
    r = 0 if stride == 0 else 64 // stride
    return {"q": q, "r": r}
''', tmp_path)
    from detent_rl.selir.specialize import specialize
    spec = specialize(mod.prog, {"mode": 0})
    assert spec.conditions == [], [c.describe() for c in spec.conditions]
    fold = specialize(mod.prog, {"mode": 0}, level="fold")
    assert len(fold.conditions) == 3  # the bounding assume and both implicit division checks remain
