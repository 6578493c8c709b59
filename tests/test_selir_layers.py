"""SelIR's modules import one another in layers: every import at module top, the module graph acyclic.

An import inside a function can hold a cycle open (each module half-initialised when the other
runs); the test reads each module's AST, so it sees imports a running program never reaches.
"""
from __future__ import annotations

import ast
from pathlib import Path

import detent_rl.selir as selir_pkg

PACKAGE = "detent_rl.selir"
SELIR_DIR = Path(selir_pkg.__file__).parent
INIT = "__init__"


def selir_imports(tree: ast.Module, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(imported selir module, line, at module top) for every import of a module of `modules`.

    `from detent_rl.selir import x` names module `x` when `x` is one, else the package itself
    (`__init__`), whose own imports then count.
    """
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from . import x`, `from .x import y`
                base = PACKAGE + ("." + base if base else "")
            if base == PACKAGE:
                targets = [f"{PACKAGE}.{a.name}" if a.name in modules else PACKAGE for a in node.names]
            else:
                targets = [base]
        else:
            continue
        for t in targets:
            if t == PACKAGE:
                out.append((INIT, node.lineno, id(node) in top))
            elif t.startswith(PACKAGE + "."):
                out.append((t[len(PACKAGE) + 1:].split(".")[0], node.lineno, id(node) in top))
    return out


def import_graph(sources: dict[str, str]) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the selir modules it imports, and `module:line -> target` for each import not at top."""
    modules = set(sources)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    nested = []
    for mod, src in sources.items():
        for target, line, at_top in selir_imports(ast.parse(src), modules):
            if target == mod:
                continue
            graph[mod].add(target)
            if not at_top:
                nested.append(f"{mod}:{line} -> {target}")
    return graph, nested


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A topological sort (Kahn: a module is placed once all it imports is placed); when it cannot
    finish, one cycle among the modules left."""
    waiting = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    done: set[str] = set()
    ready = [m for m, deps in waiting.items() if not deps]
    while ready:
        m = ready.pop()
        done.add(m)
        for user, deps in waiting.items():
            if m in deps:
                deps.discard(m)
                if not deps and user not in done:
                    ready.append(user)
    left = {m for m in graph if m not in done}
    if not left:
        return None
    path, m = [], min(left)  # every module left imports one left: walk until a module repeats
    while m not in path:
        path.append(m)
        m = min(waiting[m])
    return path[path.index(m):] + [m]


def selir_sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(SELIR_DIR.glob("*.py"))}


def test_every_selir_import_is_at_module_top():
    graph, nested = import_graph(selir_sources())
    assert len(graph) > 20  # the checker read the package, not an empty folder
    assert nested == []


def test_selir_import_graph_is_acyclic():
    graph, _ = import_graph(selir_sources())
    assert sum(len(d) for d in graph.values()) > 40
    assert find_cycle(graph) is None


def test_checker_finds_a_cycle_and_a_nested_import():
    """Negative control: two modules importing each other, one of them inside a function."""
    sources = {
        "a": "from detent_rl.selir.b import g\n\ndef f():\n    return g()\n",
        "b": "def g():\n    from detent_rl.selir import a\n    return a\n",
        "c": "from detent_rl.selir import a, SelIRError\nfrom . import b\nimport detent_rl.selir.a\n",
        INIT: "",
    }
    graph, nested = import_graph(sources)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": {"a", "b", INIT}, INIT: set()}
    assert nested == ["b:2 -> a"]
    assert find_cycle(graph) in (["a", "b", "a"], ["b", "a", "b"])
    graph["b"].clear()
    assert find_cycle(graph) is None
    # through the package: c -> __init__ -> x -> c
    via_init = {"c": "from detent_rl.selir import SelIRError\n", INIT: "from detent_rl.selir.x import y\n",
                "x": "from detent_rl.selir import c\n"}
    assert find_cycle(import_graph(via_init)[0]) == [INIT, "x", "c", INIT]

