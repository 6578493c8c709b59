"""SelIR means what Python means: random programs agree with CPython through every stage."""
from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings, strategies as st

from detent_rl.selir import SelectionError, SelIRError
from detent_rl.selir.cache import JITCache
from detent_rl.selir.selector import Selector
from detent_rl.selir.solver import solve
from selir_helpers import Failed, RandomProgram, eval_graph, load_module, run_python, same

FACT = {"f": 7}


def _points(seed: int, n: int) -> list[dict]:
    r = random.Random(seed)
    (xlo, xhi), (ylo, yhi) = RandomProgram.INPUTS["x"], RandomProgram.INPUTS["y"]
    pts = [{"x": xlo, "y": ylo, "flag": False}, {"x": xhi, "y": yhi, "flag": True}]
    pts += [{"x": r.randint(xlo, xhi), "y": r.randint(ylo, yhi), "flag": r.random() < 0.5} for _ in range(n)]
    return pts


def _outcome(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except SelectionError:
        return Failed("selection")


def _agree(py, ours) -> bool:
    if isinstance(py, Failed) or isinstance(ours, Failed):
        return isinstance(py, Failed) and isinstance(ours, Failed)
    return same(py, ours)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), level=st.sampled_from(["full", "fold"]), k=st.sampled_from([0, 2, 5]))
def test_random_programs_agree_with_cpython(tmp_path, seed, level, k):
    mod = load_module(RandomProgram(seed).source(), tmp_path)
    try:
        sol = solve(mod.prog, FACT, level=level, cache=JITCache(enabled=False))
    except SelIRError as e:
        # the analysis proved a require false on every input: Python must fail on every point too
        assert "can never hold" in str(e), e
        for p in _points(seed, 40):
            assert isinstance(run_python(mod, {"k": k}, f=FACT["f"], **p), Failed), (mod.prog.file, p)
        return
    stock = sol.stock({"k": k})
    pin_ids = {name: n.id for name, n in sol.pin_nodes.items()}
    for p in _points(seed, 40):
        py = run_python(mod, {"k": k}, f=FACT["f"], **p)
        ref = _outcome(lambda: mod.prog(knobs={"k": k}, f=FACT["f"], **p))
        got = _outcome(lambda: stock.as_dict(stock(p["x"], p["y"], p["flag"])))
        assert _agree(py, ref), (mod.prog.file, p, py, ref)
        assert _agree(py, got), (mod.prog.file, p, py, got)
        # where the unpinned program computes the pinned values, the pinned selector equals it
        values = eval_graph(list(sol.pin_nodes.values()), p, {"k": k}, {})
        pinned = Selector(sol, dict(zip(pin_ids, values)), {"k": k}, "detent")
        via_pins = _outcome(lambda: pinned.as_dict(pinned(**p)))
        assert _agree(py, via_pins), (mod.prog.file, p, py, via_pins)
