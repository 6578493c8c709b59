"""Graphviz DOT of a dependence graph: inputs tinted by kind, batch-dependent values shaded, the cut
highlighted, control edges dashed."""
from __future__ import annotations

from typing import Iterable

from detent_rl.selir.graph import Node
from detent_rl.selir.lower import DepGraph

_INPUT_COLOURS = {"Runtime": "#e41a1c", "Unpinnable": "#984ea3", "Request": "#4daf4a"}
_KNOB_COLOUR = "#377eb8"
_BATCH_FILL = "#fde0dd"
_PIN_FILL = "#ffd92f"


def _label(n: Node, names: dict[int, str]) -> str:
    if n.op in ("input", "knob"):
        text = f"{n.aux[0]}\\n{n.aux[1] if n.op == 'input' else 'knob'}"
    else:
        text = f"%{n.id} {n.op}"
        if n.id in names:
            text += f"\\n{names[n.id]}"
    return text.replace('"', "'")


def to_dot(g: DepGraph, pins: Iterable[Node], title: str, names: dict[int, str] | None = None) -> str:
    names = dict(names or {})
    pin_ids = {p.id for p in pins}
    points: dict[int, list[str]] = {}
    for name, v in g.points.items():
        if isinstance(v, Node):
            points.setdefault(v.id, []).append(name)
    lines = [f'digraph "{title}" {{', '  rankdir=LR;', '  node [fontname="Helvetica", fontsize=10];',
             f'  label="{title}\\nred: Runtime, purple: Unpinnable, green: Request, blue: knob; '
             'shaded: batch-dependent; '
             'yellow: pin (the cut); boxes: selection points; dashed: control";', '  labelloc=t;']
    for i in sorted(g.nodes):
        n = g.nodes[i]
        attrs = {"label": _label(n, names), "shape": "ellipse", "style": "filled", "fillcolor": "white"}
        if n.op == "input":
            attrs.update(color=_INPUT_COLOURS.get(n.aux[1], "black"), fillcolor=_INPUT_COLOURS.get(n.aux[1], "white"),
                         fontcolor="white", shape="invhouse")
        elif n.op == "knob":
            attrs.update(fillcolor=_KNOB_COLOUR, fontcolor="white", shape="invhouse")
        elif i in g.batch_dependent:
            attrs["fillcolor"] = _BATCH_FILL
        if i in points:
            attrs["shape"] = "box"
            attrs["label"] += "\\n= " + ", ".join(points[i])
        if i in pin_ids:
            attrs.update(fillcolor=_PIN_FILL, penwidth="3", fontcolor="black")
            attrs["label"] += "\\n[PIN]"
        attr_text = ", ".join(f'{k}="{v}"' for k, v in attrs.items())
        lines.append(f"  n{i} [{attr_text}];")
    for k, c in enumerate(g.conditions):
        if isinstance(c.value, Node):
            text = f"{c.kind}({c.text})\\nline {c.line}".replace('"', "'")
            lines.append(f'  c{k} [label="{text}", shape=hexagon, style=filled, fillcolor="#e5f5e0"];')
            lines.append(f'  n{c.value.id} -> c{k} [color="#31a354"];')
    for u, vs in sorted(g.users.items()):
        for v in vs:
            style = ' [style=dashed, color="#555555"]' if (u, v) in g.control else ""
            lines.append(f"  n{u} -> n{v}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"
