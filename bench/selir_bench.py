"""SelIR speed: cold solve, JIT-cache hit, repin and the selector call, median of 5 runs each.

Usage: python bench/selir_bench.py [--program attention ...| --all] [--runs 5] [--plain]
All figures are measured in this one process, side by side, on the machine it runs on. `--plain` adds
a cold solve whose legality check runs the compiled conditions once per assignment over every input
point (`legal.plain_table`, what `selir/cases.py`'s case splits replace and must equal): the same
tables, so the ratio is the case splitting's alone.
"""
from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import tempfile
import time
import timeit
from contextlib import contextmanager

from detent_rl.kernels.programs.registry import programs
from detent_rl.selir.cache import JITCache
from detent_rl.selir.cases import CaseJudge
from detent_rl.selir.solver import solve

TARGETS_MS = {"cold solve": 5000.0, "cache hit": 20.0, "repin": 4.0}
TARGET_CALL_US = 5.0


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@contextmanager
def plain_check():
    """Inside, every condition group is judged by the compiled check over its whole product."""
    cases = CaseJudge.table
    CaseJudge.table = lambda self, rows, candidates, cond_index, fallback: fallback()
    try:
        yield
    finally:
        CaseJudge.table = cases


def bench(name: str, runs: int, plain: bool = False) -> list[tuple[str, float, str, bool]]:
    program, deployments = programs()[name]
    facts = next(iter(deployments.values()))
    rows = []
    cold = median_ms(lambda: solve(program, facts, cache=JITCache(enabled=False)), runs)
    rows.append(("cold solve", cold, "ms", cold <= TARGETS_MS["cold solve"]))
    if plain:
        with plain_check():
            reference = solve(program, facts, cache=JITCache(enabled=False))
            ms = median_ms(lambda: solve(program, facts, cache=JITCache(enabled=False)), runs)
        assert reference.legal == solve(program, facts, cache=JITCache(enabled=False)).legal, name
        rows.append(("cold solve, plain check", ms, "ms", ms <= TARGETS_MS["cold solve"]))
    with tempfile.TemporaryDirectory() as d:
        cache = JITCache(d)
        solve(program, facts, cache=cache)
        hit = median_ms(lambda: solve(program, facts, cache=cache), runs)
        assert solve(program, facts, cache=cache).from_cache
    rows.append(("cache hit", hit, "ms", hit <= TARGETS_MS["cache hit"]))
    sol = solve(program, facts, cache=JITCache(enabled=False))
    sel = sol.commit()
    legal = sol.legal
    alternatives = [sol.split(a) for a in legal[:: max(1, len(legal) // runs)][:runs]]
    it = itertools.cycle(alternatives)
    rep = median_ms(lambda: sel.repin(*next(it)), runs)
    rows.append(("repin", rep, "ms", rep <= TARGETS_MS["repin"]))
    args = tuple((lo if lo is not None else values[0]) for lo, hi, values in
                 (sol.domains.get(p, (None, None, (False, True))) for p in sol.params))
    sel(*args)  # seen once: the call sites' steady state
    per_call = []
    for _ in range(runs):
        n = 200_000
        per_call.append(timeit.timeit(lambda: sel(*args), number=n) / n * 1e6)
    call = statistics.median(per_call)
    rows.append(("selector call (seen input)", call, "us", call <= TARGET_CALL_US))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", action="append", help="program(s) to time (default: attention); --all for every one")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--plain", action="store_true", help="also a cold solve by the compiled check over the product")
    args = ap.parse_args()
    names = list(programs()) if args.all else (args.program or ["attention"])
    print(f"# SelIR bench: median of {args.runs}, Python {platform.python_version()}, {platform.machine()}")
    print("| program | measurement | median | target | met |")
    print("|---|---|---|---|---|")
    for name in names:
        for what, value, unit, ok in bench(name, args.runs, args.plain):
            target = TARGETS_MS.get(what.split(",")[0], TARGET_CALL_US)
            print(f"| {name} | {what} | {value:.3f} {unit} | <= {target:g} {unit} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
