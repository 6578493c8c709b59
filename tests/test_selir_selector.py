"""Compiled selectors: batch invariance when committed (with the stock arm as negative control),
the runtime guard, one check per input combination, and repin without re-solving."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from detent_rl.kernels.programs import attention as attn_mod, matmul as matmul_mod
from detent_rl.selir import SelectionError
from detent_rl.selir.cache import JITCache
from detent_rl.selir.cases import TooManyCases
from detent_rl.selir.solver import solve

FACTS = attn_mod.REFERENCE_FACTS


@pytest.fixture(scope="module")
def sol():
    return solve(attn_mod.attention_program, FACTS, cache=JITCache(enabled=False))


def attention_inputs():
    @st.composite
    def draw(draw):
        batch = draw(st.integers(1, FACTS["max_batch"]))
        q = draw(st.one_of(st.just(1), st.integers(1, FACTS["max_num_tokens"])))
        tokens = draw(st.integers(max(batch, q), FACTS["max_num_tokens"]))
        k = draw(st.integers(1, FACTS["max_context"]))
        return batch, q, tokens, k
    return draw()


@settings(max_examples=300, deadline=None)
@given(inputs=attention_inputs())
def test_committed_selector_is_identical_for_every_runtime_input(sol, inputs):
    sel = sol.commit()
    reference = sel(1, 1, 1, 1)
    assert sel.bits(sel(*inputs)) == sel.bits(reference)  # the declared schedule (stages, packing) may move


@settings(max_examples=200, deadline=None)
@given(inputs=attention_inputs())
def test_stock_selector_equals_program(sol, inputs):
    batch, q, tokens, k = inputs
    stock = sol.stock()
    want = attn_mod.attention_program(batch=batch, max_seqlen_q=q, num_tokens=tokens, max_seqlen_k=k, **FACTS)
    assert stock.as_dict(stock(*inputs)) == want


def test_negative_control_stock_selection_reads_the_batch(sol):
    stock, committed = sol.stock(), sol.commit()
    rng = random.Random(0)
    seen_stock, seen_committed = set(), set()
    # one request (KV 3,000) decoding next to ever more co-batched requests
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        seen_stock.add(stock(batch, 1, batch, 3000))
        seen_committed.add(tuple(committed.bits(committed(batch, 1, batch, 3000)).items()))
        q = rng.randint(2, 512)
        seen_stock.add(stock(batch, q, batch + q, 3000))
        seen_committed.add(tuple(committed.bits(committed(batch, q, batch + q, 3000)).items()))
    assert len(seen_stock) > 1, "the stock arm must change its selection with the batch"
    assert len({s.num_splits for s in seen_stock}) > 1 and len({s.block_n for s in seen_stock}) > 1
    assert len(seen_committed) == 1


def test_violating_input_stops_before_any_kernel(sol):
    sel = sol.commit()
    launched = []

    def call_site(*inputs):
        choice = sel(*inputs)  # selection first: a violation must raise here
        launched.append(choice)

    call_site(4, 1, 4, 100)
    with pytest.raises(SelectionError, match="max_seqlen_k=5000 is outside its assumed domain"):
        call_site(4, 1, 4, 5000)
    with pytest.raises(SelectionError, match=r"assume\(batch <= num_tokens.*attention.py:\d+"):
        call_site(8, 1, 4, 100)  # 8 requests cannot fit in 4 tokens
    assert len(launched) == 1
    # the stock arm is guarded the same way
    with pytest.raises(SelectionError):
        sol.stock()(8, 1, 4, 100)


def test_conditions_are_checked_once_per_input_combination(sol):
    sel = sol.commit()
    for _ in range(5):
        for inputs in ((1, 1, 1, 10), (2, 1, 2, 10), (1, 1, 1, 10)):
            sel(*inputs)
    assert sel.checks_run == 2
    with pytest.raises(SelectionError):
        sel(8, 1, 4, 100)
    with pytest.raises(SelectionError):
        sel(8, 1, 4, 100)  # a failing combination is never memoised: it fails every time
    assert sel.checks_run == 4


def test_repin_swaps_constants_without_resolving(sol, monkeypatch):
    import detent_rl.selir.solver as solver_mod
    sel = sol.commit()
    monkeypatch.setattr(solver_mod, "analyze", lambda *a, **k: pytest.fail("repin must not re-solve"))
    legal = [a for a in sol.legal if dict(zip(sol.axes, a))["split_stride"] == 1024]
    pins, knobs = sol.split(legal[0])
    other = sel.repin(pins, knobs)
    out = other.as_dict(other(3, 1, 3, 100))
    assert out["num_splits"] == pins["num_splits"] and out["split_size"] == pins["split_size"]
    assert f"split_stride={knobs['split_stride']}" in other.source
    assert sel(3, 1, 3, 100) != other(3, 1, 3, 100) or pins == sel.pins


def test_illegal_repin_is_refused_with_a_witness(sol):
    sel = sol.commit()
    with pytest.raises(SelectionError,
                       match=r"illegal: require\(num_splits \* split_size >= max_seqlen_k\).*fails at inputs"):
        sel.repin({"num_splits": 1, "split_size": 128})
    with pytest.raises(SelectionError, match="split_size % block_n"):
        sel.repin({"block_n": 128, "split_size": 192, "num_splits": 32})


def test_source_has_a_provenance_header(sol):
    src = sol.commit().source
    head = src.splitlines()[:6]
    assert head[0].startswith("# detent_rl.selir compiled selector")
    assert "program: attention" in head[1] and f"ir: {sol.ir_hash}" in head[2]
    assert "pins: block_n=" in head[4] and "knobs: split_stride=" in head[5]


@pytest.mark.parametrize("module", [attn_mod, matmul_mod], ids=["attention", "matmul"])
def test_outcomes_are_what_each_committed_selector_returns_or_refuses(module):
    """`Solution.outcomes` (the tuner's grouping of thousands of assignments) gives, for every assignment and
    call, the values a selector committed to that assignment returns, and fails where that selector raises."""
    sol = solve(module.PROGRAM, module.REFERENCE_FACTS)
    rng = random.Random(0)
    calls = [tuple(rng.randint(sol.domains[p][0], sol.domains[p][1] if rng.random() < 0.3 else 300)
                   for p in sol.params) for _ in range(12)]
    calls += [tuple(1 for _ in sol.params), tuple(sol.domains[p][1] for p in sol.params)]
    outcome = sol.outcomes(calls)
    refused = 0
    for a in [sol.default] + rng.sample(sol.legal, 150):
        selector = sol.commit(*sol.split(a))
        for x, (values, ok) in zip(calls, outcome(a)):
            try:
                want = selector(*x)
            except SelectionError:
                assert not ok, (a, x)
                refused += 1
                continue
            assert ok and repr(values) == repr(tuple(want)), (a, x, values, want)
    assert module is matmul_mod or refused, "the attention calls include some its assumes refuse"
    with pytest.raises(TooManyCases):  # a call's values read pins and knobs: past one case a call, it stops
        sol.outcomes(calls, max_cases=len(calls))
