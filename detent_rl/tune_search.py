"""The tuner's search over one call site's candidates (`python -m detent_rl.tune`): the candidates cut
to one per distinct launch (`candidates`), then measured whole when few, else by coordinate descent
from the default with long numeric axes bracketed in log-spaced rounds (`search`)."""
from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any, Callable, Optional

from detent_rl.kernels.programs import attention as attention_program
from detent_rl.selir.cases import TooManyCases
from detent_rl.selir.errors import SelectionError

EXHAUSTIVE = 8  # grids this small are measured whole
CASES_PER_CANDIDATE = 4  # case trees past this many leaves a candidate cost more than compiling selectors
BUDGET = 0.10  # larger grids: at most this share of the candidates is measured


MIN_GAIN = 0.02  # a site leaves its default only for a saving of at least this share, re-timed side by side


def confirm(default: tuple, best: tuple, cost: Callable[[tuple], float], rounds: int,
            min_gain: Optional[float] = None) -> tuple[tuple, float, float]:
    """(kept, default's median, best's median): the search's best re-timed beside the default, `rounds`
    rounds, which goes first alternating. The search keeps the minimum of many single timings, so its
    winner's time is the luckiest of its candidates': a 1 % "gain" is within that luck. The best is
    kept only where its median saves at least `min_gain` of the default's; else the default stays,
    whose rules were made for every M, where a pick serves the workload's calls alone (on the H200 the
    1.5B down projection's search best, 1.4 % faster when re-timed, was turned down; docs/BENCHMARKS.md,
    session 29)."""
    min_gain = MIN_GAIN if min_gain is None else min_gain
    times: dict[tuple, list[float]] = {default: [], best: []}
    for r in range(rounds):
        for a in (default, best) if r % 2 == 0 else (best, default):
            times[a].append(cost(a))
    d, b = statistics.median(times[default]), statistics.median(times[best])
    return (best if b <= d * (1 - min_gain) else default), d, b


def budget_for(grid: int) -> int:
    """The most candidates a search of a `grid`-assignment site measures."""
    return max(EXHAUSTIVE, math.floor(BUDGET * grid))


def search(axes: tuple[str, ...], legal: list[tuple], default: tuple, cost: Callable[[tuple], float],
           budget: Optional[int] = None) -> tuple[tuple, dict[tuple, float]]:
    """The cheapest legal assignment found and every cost measured. Grids of at most EXHAUSTIVE are
    measured whole; larger ones by coordinate descent from `default`, at most `budget` measurements
    (default: BUDGET of the grid). An axis of more than LADDER values is bracketed instead of swept:
    LADDER values spread over it (geometrically where they are positive numbers), then the values
    between the best one's sampled neighbours, again, until the bracket closes. A move to a value
    whose assignment (the best with that one value changed) is not a candidate goes to the candidate
    with that value that agrees with the best on the most other axes: coupled values (attention's
    split size and count) move together."""
    measured: dict[tuple, float] = {}
    if len(legal) <= EXHAUSTIVE:
        for a in legal:
            measured[a] = cost(a)
        return min(measured, key=measured.get), measured
    ok = set(legal)
    if default not in ok:
        raise ValueError(f"search: the starting assignment {default} is not among the {len(legal)} candidates")
    with_value: dict[tuple[int, Any], list[tuple]] = {}
    for a in legal:
        for i, v in enumerate(a):
            with_value.setdefault((i, v), []).append(a)
    if budget is None:
        budget = budget_for(len(legal))
    values = [_ordered({a[i] for a in legal}) for i in range(len(axes))]
    best = default
    measured[best] = cost(best)

    def visit(i: int, v: Any) -> bool:
        """Measure `best` with axis i at v (if legal and new); True when that became the best."""
        nonlocal best
        a = best[:i] + (v,) + best[i + 1:]
        if a not in ok:
            a = max(with_value[(i, v)], key=lambda c: sum(x == y for x, y in zip(c, best)))
        if a in measured or len(measured) >= budget:
            return False
        measured[a] = cost(a)
        if measured[a] < measured[best]:
            best = a
            return True
        return False

    improved = True
    while improved and len(measured) < budget:
        improved = False
        for i, vals in enumerate(values):
            lo, hi = 0, len(vals) - 1
            while len(measured) < budget:
                picks = _ladder(vals, lo, hi)
                for j in picks:
                    improved = visit(i, vals[j]) or improved
                at = vals.index(best[i])
                if len(picks) == hi - lo + 1 or not lo <= at <= hi:
                    break  # the bracket is swept whole (or the best lies outside it)
                bracket = max((j for j in picks if j < at), default=lo), min((j for j in picks if j > at), default=hi)
                if bracket[1] - bracket[0] <= 1 or bracket == (lo, hi):
                    break
                lo, hi = bracket
    return best, measured


LADDER = 8  # an axis of more values is bracketed: this many samples a round


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ordered(values: set) -> list:
    """An axis's values in their natural order where they have one (numbers), else by repr."""
    if all(_number(v) for v in values):
        return sorted(values)
    return sorted(values, key=repr)


def _ladder(vals: list, lo: int, hi: int) -> list[int]:
    """Up to LADDER indices of vals[lo..hi], both ends included: evenly spread in log(value) where
    the values are positive numbers (split sizes, chunks: a factor matters more than a difference),
    else in index."""
    if hi - lo + 1 <= LADDER:
        return list(range(lo, hi + 1))
    if all(_number(v) and v > 0 for v in vals[lo:hi + 1]):
        a, b = math.log(vals[lo]), math.log(vals[hi])
        targets = [a + (b - a) * t / (LADDER - 1) for t in range(LADDER)]
        picks = {min(range(lo, hi + 1), key=lambda j: abs(math.log(vals[j]) - x)) for x in targets}
    else:
        picks = set()
    # clustered values leave fewer: filled up evenly in index, then in order, so a bracket always narrows
    for j in [lo + round((hi - lo) * t / (LADDER - 1)) for t in range(LADDER)] + list(range(lo, hi + 1)):
        if len(picks) >= LADDER:
            break
        picks.add(j)
    return sorted(picks)


def candidates(family: str, sol: Any, default: tuple, calls: Counter, facts: dict) -> list[tuple]:
    """The legal assignments worth measuring: one per distinct launch, over every recorded call.

    1. Dominated ones dropped. Attention: with the split size pinned, more splits than cover the
       deployment's context only add programs that exit at once (their keys lie past every row) and
       a larger partial buffer, never other bits: only the fewest covering splits are kept.
    2. Assignments whose selections equal another's on every recorded call launch the same kernels:
       one of each such group is kept (the default stands for its own). Knobs that a pin makes dead
       (attention's split stride once the split is pinned) collapse here.
    3. Assignments whose conditions a recorded call breaks are dropped (they would refuse that call).
    """
    axes, legal = sol.axes, sol.legal
    if family == "attention" and "split_size" in axes and "num_splits" in axes:
        size, count = axes.index("split_size"), axes.index("num_splits")
        fewest = lambda a: min(-(-facts["max_context"] // a[size]), attention_program.MAX_SPLITS)  # noqa: E731
        legal = [a for a in legal if a[count] == fewest(a) or a == default]
    args = sorted(calls)
    try:  # a committed selector's values on every call, without compiling one
        outcome = sol.outcomes(args, max_cases=CASES_PER_CANDIDATE * len(legal))
    except TooManyCases:  # selections reading every axis at every call: one compiled selector a candidate
        def outcome(a: tuple) -> list[tuple[tuple, bool]]:
            selector = sol.commit(*sol.split(a))
            seen = []
            for x in args:
                try:
                    seen.append((selector(*x), True))
                except SelectionError:
                    seen.append((None, False))
            return seen
    groups: dict[tuple, tuple] = {}
    for a in [default] + [a for a in legal if a != default]:
        seen = outcome(a)
        if a == default or all(ok for _, ok in seen):  # (one whose conditions a call breaks cannot run it)
            groups.setdefault(tuple(repr(values) for values, _ in seen), a)
    return list(groups.values())
