"""Compiled selectors (stage 6): generated Python with the pins as constants, checked once per input.

`Selector.__call__` is the fast path every kernel call site runs: it looks the Runtime inputs up
in a memo and only on a new combination computes the selection and checks every require/assume
(raising `SelectionError` before any kernel can run). A new batch never triggers a recompile;
`repin` swaps the constants by regenerating the small pinned source.
"""
from __future__ import annotations

import keyword
import re
from collections import Counter, namedtuple
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from detent_rl.selir.codegen import RUNTIME_HELPERS, Emitter, lit
from detent_rl.selir.errors import SelectionError

MEMO_MAX = 1 << 16  # distinct input combinations kept; the memo is cleared when full


def field_name(point: str) -> str:
    name = re.sub(r"\W", "_", point).strip("_") or "value"
    return name + "_" if keyword.iskeyword(name) or name[0].isdigit() else name


class Selector:
    """A compiled selection: `selector(**runtime_inputs)` returns the selection points."""

    def __init__(self, solution: Any, pins: dict[str, Any], knobs: dict[str, Any], arm: str) -> None:
        self.solution = solution
        self.arm = arm
        self.pins = dict(pins)
        self.knobs = dict(knobs)
        self.point_names = tuple(solution.outputs)
        schedule = set(solution.stats.get("schedule_points", ()))
        self.bit_points = tuple(p for p in self.point_names if p not in schedule)
        self.params = tuple(solution.params)
        self.source = self._generate()
        self._namespace = self._load()
        self._select = self._namespace["select"]

    @property
    def checks_run(self) -> int:
        """How many input combinations were computed and checked (each at most once while memoised)."""
        return self._namespace["_STATS"][0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._select(*args, **kwargs)

    @contextmanager
    def counting(self, counter: Counter) -> Iterator[Counter]:
        """While inside, count each call's arguments in `counter` (a tuner's profile of a workload)."""
        select = self._select

        def counted(*args: Any, **kwargs: Any) -> Any:
            counter[args + tuple(sorted(kwargs.items()))] += 1
            return select(*args, **kwargs)
        self._select = counted
        try:
            yield counter
        finally:
            self._select = select

    def as_dict(self, result: Any) -> dict[str, Any]:
        return dict(zip(self.point_names, result))

    def bits(self, result: Any) -> dict[str, Any]:
        """The selection points of `result` that decide bits: all but the declared schedule (which a
        pinned selector may still compute from the batch)."""
        return {p: v for p, v in zip(self.point_names, result) if p in self.bit_points}

    def repin(self, pins: Optional[dict] = None, knobs: Optional[dict] = None) -> "Selector":
        """A selector with other pin/knob values, without re-solving (the values must be legal)."""
        new_pins = {**self.pins, **(pins or {})}
        new_knobs = {**self.knobs, **(knobs or {})}
        if self.arm == "detent":
            self.solution.check_legal(new_pins, new_knobs)
        return Selector(self.solution, new_pins, new_knobs, self.arm)

    # ---- generation -----------------------------------------------------------------------
    def _generate(self) -> str:
        sol = self.solution
        values = {sol.pin_nodes[name].id: v for name, v in self.pins.items()}
        pinned = {i: lit(v) for i, v in values.items()}
        em = Emitter(pinned, {k: lit(v) for k, v in self.knobs.items()}, values, self.knobs)
        conds = [c.value for c in sol.conditions]
        outs = [sol.outputs[p] for p in self.point_names]
        body = em.lines(outs + conds, indent="    ")
        params = ", ".join(self.params)
        key = f"({params},)" if self.params else "()"
        checks = []
        for i, (name, (lo, hi, values)) in enumerate(sorted(sol.domains.items())):
            test = []
            if values is not None:
                test.append(f"{name} in {em.table('D', 'frozenset(' + lit(tuple(values)) + ')')}")
            if lo is not None:
                test.append(f"{lit(lo)} <= {name} <= {lit(hi)}")
            checks.append(f"    if not ({' and '.join(test)}): _fail_domain({name!r}, {key})")
        for i, c in enumerate(conds):
            test = em.operand(c)
            if test != "True":  # an always-false condition still fails at the call, as Python would
                checks.append(f"    if not {test}: _fail({i}, {key})")
        result = ", ".join(em.operand(o) for o in outs)
        header = [
            "# detent_rl.selir compiled selector (generated; do not edit)",
            f"# program: {sol.program_name} ({sol.program_file}:{sol.program_line})",
            f"# ir: {sol.ir_hash}  level: {sol.level}  arm: {self.arm}",
            f"# facts: {sol.facts_text}",
            f"# pins: {', '.join(f'{k}={v!r}' for k, v in self.pins.items()) or '-'}",
            f"# knobs: {', '.join(f'{k}={v!r}' for k, v in self.knobs.items()) or '-'}",
        ]
        return "\n".join(header + em.prelude() + [
            "_MEMO = {}",
            f"def select({params}):",
            f"    hit = _MEMO.get({key})",
            "    if hit is None:",
            f"        hit = _compute({params})",
            "    return hit",
            "",
            f"def _compute({params}):",
            "    _STATS[0] += 1",
            *checks[:len(sol.domains)],
            *body,
            *checks[len(sol.domains):],
            f"    out = _Result({result}{',' if len(outs) == 1 else ''})",
            f"    if len(_MEMO) >= {MEMO_MAX}:",
            "        _MEMO.clear()",
            f"    _MEMO[{key}] = out",
            "    return out",
            "",
        ])

    def _load(self) -> dict:
        sol = self.solution
        fields = [field_name(p) for p in self.point_names]
        if len(set(fields)) != len(fields):
            fields = [f"{f}_{i}" for i, f in enumerate(fields)]
        ns: dict[str, Any] = dict(RUNTIME_HELPERS)
        ns["_Result"] = namedtuple(f"{field_name(sol.program_name)}_selection", fields or ["_"])
        params = self.params
        conds = sol.conditions

        def _fail(i: int, args: tuple) -> None:
            raise SelectionError(
                f"selection {sol.program_name}: {conds[i].describe()} is violated by inputs "
                f"{dict(zip(params, args))}; no kernel may run with this selection")

        def _fail_domain(name: str, args: tuple) -> None:
            lo, hi, values = sol.domains[name]
            allowed = f"one of {values}" if values is not None else f"in [{lo}, {hi}]"
            raise SelectionError(
                f"selection {sol.program_name}: input {name}={dict(zip(params, args))[name]!r} is "
                f"outside its assumed domain ({allowed}, from the program's assume); no kernel may "
                f"run with this selection")

        ns["_fail"], ns["_fail_domain"], ns["_STATS"] = _fail, _fail_domain, [0]
        exec(compile(self.source, f"<selector {sol.program_name} {self.arm}>", "exec"), ns)
        return ns
