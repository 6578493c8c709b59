"""A solved selection program: pins, legal assignments, and the selectors built from them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from detent_rl.selir.cases import CaseJudge, lookup
from detent_rl.selir.errors import SelectionError, SelIRError
from detent_rl.selir.graph import Node
from detent_rl.selir.legal import enumerate_legal, why_illegal
from detent_rl.selir.selector import Selector


@dataclass
class Solution:
    program_name: str
    program_file: str
    program_line: int
    ir_hash: str
    level: str
    facts_text: str
    params: tuple[str, ...]  # batch-dependent inputs, in declaration order
    domains: dict[str, tuple]  # name -> (lo, hi, values)
    outputs: dict[str, Any]  # selection point -> Node or constant
    conditions: list
    pin_nodes: dict[str, Node]
    knobs: dict[str, tuple]  # name -> (choices, default)
    axes: tuple[str, ...]
    candidates: dict[str, tuple]
    candidate_source: dict[str, str]
    groups: list  # per condition group: (axis positions, {rejected projection: (cond, point)})
    default: Optional[tuple]
    stats: dict = field(default_factory=dict)
    from_cache: bool = False

    def __post_init__(self) -> None:
        self._legal: Optional[list[tuple]] = None

    @property
    def legal(self) -> list[tuple]:
        """Every legal assignment (enumerated on first use; membership needs no enumeration)."""
        if self._legal is None:
            self._legal = enumerate_legal(self.axes, self.candidates, self.groups)
        return self._legal

    def is_candidate(self, a: tuple) -> bool:
        return all(x in self.candidates[ax] for ax, x in zip(self.axes, a))

    # ---- assignments --------------------------------------------------------------------
    def split(self, assignment: tuple) -> tuple[dict, dict]:
        values = dict(zip(self.axes, assignment))
        return ({k: values[k] for k in self.pin_nodes}, {k: values[k] for k in self.knobs})

    def assignment(self, pins: dict, knobs: dict) -> tuple:
        unknown = (set(pins) - set(self.pin_nodes)) | (set(knobs) - set(self.knobs))
        if unknown:
            raise SelIRError(f"selection {self.program_name} has no pin or knob named {sorted(unknown)}; "
                             f"pins: {sorted(self.pin_nodes)}, knobs: {sorted(self.knobs)}")
        missing = [a for a in self.axes if a not in pins and a not in knobs]
        if missing:
            raise SelIRError(f"selection {self.program_name}: no value given for {missing}")
        return tuple(pins[a] if a in self.pin_nodes else knobs[a] for a in self.axes)

    def check_legal(self, pins: dict, knobs: dict) -> None:
        a = self.assignment(pins, knobs)
        found = self.witness(pins, knobs)
        if found is not None:
            cond, point = found
            raise SelectionError(f"selection {self.program_name}: assignment {dict(zip(self.axes, a))} is "
                                 f"illegal: {cond.describe()} fails at inputs {point}")
        if not self.is_candidate(a):
            raise SelectionError(f"selection {self.program_name}: {dict(zip(self.axes, a))} is not "
                                 f"among the candidates {self.candidates}")

    def witness(self, pins: dict, knobs: dict) -> Optional[tuple[Any, dict]]:
        """(condition, input point) showing why an assignment is illegal; None if it is legal."""
        why = why_illegal(self.groups, self.assignment(pins, knobs))
        if why is None:
            return None
        return self.conditions[why[0]], dict(zip(self.stats.get("point_names", ()), why[1]))

    # ---- selectors ----------------------------------------------------------------------
    def commit(self, pins: Optional[dict] = None, knobs: Optional[dict] = None) -> Selector:
        """The detent arm: pins fixed to a legal assignment (the default tuple if none given)."""
        if self.default is None:
            raise SelIRError(f"selection {self.program_name} has no legal assignment")
        d_pins, d_knobs = self.split(self.default)
        pins = {**d_pins, **(pins or {})}
        knobs = {**d_knobs, **(knobs or {})}
        self.check_legal(pins, knobs)
        return Selector(self, pins, knobs, "detent")

    def stock(self, knobs: Optional[dict] = None) -> Selector:
        """The stock arm: nothing pinned; selection reads the batch as engines ship it."""
        knobs = {**{k: d for k, (_, d) in self.knobs.items()}, **(knobs or {})}
        for k, v in knobs.items():
            if k not in self.knobs or v not in self.knobs[k][0]:
                raise SelIRError(f"selection {self.program_name}: knob {k}={v!r} is not declared "
                                 f"or not one of its choices")
        return Selector(self, {}, knobs, "stock")

    def outcomes(self, calls: list[tuple], max_cases: Optional[int] = None) -> Callable[[tuple], tuple]:
        """For an assignment, per call (positional Runtime inputs): the selection points' values and whether
        every condition holds there — what a selector committed to it would return (or refuse), found
        without compiling one. Each call is split into cases on the pins and knobs it reads
        (`selir/cases.py`), so the thousands of assignments a tuner compares cost lookups. Where the calls
        split into more than `max_cases` cases in all (selections that read every axis), TooManyCases."""
        outs = [self.outputs[p] for p in self.outputs]
        cases = CaseJudge(outs + [c.value for c in self.conditions], self.axes,
                          {n.id: name for name, n in self.pin_nodes.items()}, {}, self.params)
        if any(len(x) != len(self.params) for x in calls):
            raise ValueError(f"selection {self.program_name}: calls give {self.params} by position")
        trees, left = [], max_cases
        for x in calls:
            tree, count = cases.tree(tuple(x), self.candidates, left)
            trees.append(tree)
            if left is not None:
                left -= count
        bounds = [self.domains.get(p, (None, None, None)) for p in self.params]
        inside = [all((values is None or v in values) and (lo is None or lo <= v <= hi)
                      for v, (lo, hi, values) in zip(x, bounds)) for x in calls]

        def outcome(assignment: tuple) -> tuple:
            values = dict(zip(self.axes, assignment))
            return tuple((v[:len(outs)], ok and all(v[len(outs):]))
                         for v, ok in zip((lookup(t, values) for t in trees), inside))
        return outcome
