"""Partial evaluation of a selection program on deployment facts (stage 2).

Facts become constants; Runtime/Unpinnable/Request inputs and knobs become graph leaves. Branches on
constants are pruned, loops over static collections unrolled, helper selections inlined, and the
rest is built through the simplifying `Builder`, so the result is one dependence graph. With every
input given, the same evaluator is the reference semantics of a program (`evaluate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from detent_rl.selir import syntax as S
from detent_rl.selir.errors import SelectionError, SelIRError
from detent_rl.selir.exec import Cond, Evaluator
from detent_rl.selir.graph import Builder, Node
from detent_rl.selir.values import flatten


@dataclass
class Specialized:
    program: Any
    facts: dict
    level: str
    builder: Builder
    inputs: dict[str, Node]  # batch-dependent inputs still read by the graph, by name
    input_kinds: dict[str, str]
    input_types: dict[str, str]
    knobs: dict[str, tuple]  # name -> (choices, default)
    knob_nodes: dict[str, Node]
    outputs: dict[str, Any]  # selection point name -> Node or constant
    conditions: list[Cond]
    input_ranges: dict = field(default_factory=dict)
    input_domains: dict = field(default_factory=dict)  # name -> tuple of allowed values


def specialize(program: Any, facts: dict, level: str = "full",
               knob_values: Optional[dict] = None) -> Specialized:
    """Specialize on facts. Input ranges come from the program's own top-level assumes."""
    ranges, domains = {}, {}
    if level == "full":
        probe = _run(program, facts, Builder("fold"), knob_values, None)
        ranges, domains = input_bounds(probe)
    spec = _run(program, facts, Builder(level, ranges), knob_values, None)
    # Under `full` the bounding assumes fold away (the leaves carry their ranges), so the bounds
    # come from the probe; the compiled selector checks them as input domains either way.
    spec.input_ranges, spec.input_domains = (ranges, domains) if level == "full" else input_bounds(spec)
    return spec


def evaluate(program: Any, values: dict, knobs: dict) -> dict[str, Any]:
    """Run a program with every input given; raise SelectionError if a condition fails."""
    spec = _run(program, values, Builder("fold"), knobs, values)
    return {k: v for k, v in spec.outputs.items()}


def _run(program: Any, facts: dict, builder: Builder, knob_values: Optional[dict],
         batch_values: Optional[dict]) -> Specialized:
    ev = Evaluator(builder, knob_values, concrete=batch_values is not None)
    env: dict[str, Any] = {}
    inputs, kinds, types = {}, {}, {}
    for p in program.params:
        if p.kind == "Fact" or batch_values is not None:
            src = facts if p.kind == "Fact" else batch_values
            if p.name not in src:
                what = "deployment fact" if p.kind == "Fact" else f"{p.kind} input"
                raise SelIRError(f"{what} '{p.name}' of selection {program.name} was not given",
                                 file=program.file, line=program.line)
            env[p.name] = _checked(program, p, src[p.name])
            continue
        if p.type not in ("int", "float", "bool", "str"):
            raise SelIRError(f"{p.kind} input '{p.name}' must be int, float, bool or str",
                             file=program.file, line=program.line)
        node = builder.leaf("input", (p.name, p.kind, p.type), p.type,
                            builder.input_ranges.get(p.name))
        env[p.name] = inputs[p.name] = node
        kinds[p.name], types[p.name] = p.kind, p.type
    if batch_values is not None:
        for k in batch_values:
            if k not in {p.name for p in program.params}:
                raise SelIRError(f"selection {program.name} has no input named '{k}'",
                                 file=program.file, line=program.line)
    ret_c, ret_v = ev.block(program, program.body, env, True)
    if ret_c is not True:
        raise SelIRError(f"selection {program.name} may finish without returning",
                         file=program.file, line=program.line)
    outputs = flatten(ret_v)
    if batch_values is not None:
        failed = [c for c in ev.conditions if c.value is not True]
        if failed:
            raise SelectionError(f"selection {program.name}: {failed[0].describe()} is violated "
                                 f"by inputs {batch_values}")
    else:
        for c in ev.conditions:
            if c.value is False:
                raise SelIRError(f"{c.describe()} can never hold for these deployment facts",
                                 file=c.file, line=c.line)
    conds = [c for c in ev.conditions if c.value is not True]
    return Specialized(program, dict(facts), builder.level, builder, inputs, kinds, types,
                       dict(ev.knobs), dict(ev.knob_nodes), outputs, conds)


def _checked(program: Any, p: S.Param, v: Any) -> Any:
    ok = {"int": lambda x: type(x) is int, "float": lambda x: isinstance(x, (int, float)) and type(x) is not bool,
          "bool": lambda x: type(x) is bool, "str": lambda x: isinstance(x, str),
          "tuple": lambda x: isinstance(x, tuple)}.get(p.type, lambda x: type(x).__name__ == p.type)
    if not ok(v):
        raise SelIRError(f"{p.kind} '{p.name}' of selection {program.name} must be {p.type}, got {v!r}",
                         file=program.file, line=program.line)
    return v


def input_bounds(spec: Specialized) -> tuple[dict, dict]:
    """Intervals (and finite domains) of inputs from unguarded assumes like `1 <= x <= hi`."""
    ranges: dict[str, list] = {}
    domains: dict[str, tuple] = {}
    for c in spec.conditions:
        if c.kind != "assume" or not isinstance(c.value, Node):
            continue
        for atom in _conjuncts(c.value):
            _bound(atom, ranges, domains)
    for name, node in spec.inputs.items():
        if node.type == "bool":
            domains.setdefault(name, (False, True))
    out = {k: (lo, hi) for k, (lo, hi) in ranges.items()}
    for k, d in domains.items():
        if all(isinstance(v, (int, float)) for v in d):
            lo, hi = out.get(k, (min(d), max(d)))
            out[k] = (max(lo, min(d)), min(hi, max(d)))
    return out, domains


def _conjuncts(n: Any) -> list:
    if isinstance(n, Node) and n.op == "select" and n.args[2] is False:
        return _conjuncts(n.args[0]) + _conjuncts(n.args[1])
    return [n]


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}


def _bound(atom: Any, ranges: dict, domains: dict) -> None:
    if not isinstance(atom, Node):
        return
    if atom.op == "member" and isinstance(atom.args[0], Node) and atom.args[0].op == "input":
        domains[atom.args[0].aux[0]] = tuple(atom.aux)
        return
    if atom.op not in _FLIP:
        return
    a, b = atom.args
    op = atom.op
    if isinstance(b, Node) and not isinstance(a, Node):
        a, b, op = b, a, _FLIP[op]
    if not (isinstance(a, Node) and a.op == "input") or isinstance(b, Node) \
            or type(b) not in (int, float):
        return
    is_int = a.type == "int"
    lo, hi = ranges.setdefault(a.aux[0], [float("-inf"), float("inf")])
    if op in ("ge", "gt", "eq"):
        lo = max(lo, b + 1 if op == "gt" and is_int else b)
    if op in ("le", "lt", "eq"):
        hi = min(hi, b - 1 if op == "lt" and is_int else b)
    ranges[a.aux[0]] = [lo, hi]
