"""The JIT cache (stage 7): solved programs on disk, keyed by everything that can change the answer.

Key: sha256 of the canonical program (with its tables and inlined helpers), the facts, the solve
options, the detent_rl version, the SelIR format and a hash of SelIR's own source, and the Python
version. Each entry is
`<sha256 of body>\\n<body>`, the body being the solution as plain data in `marshal` format (fast
to load; the Python version is in the key, and the checksum is verified before anything is
decoded). Entries are written to a temporary file and renamed into place, so readers never see a
torn file; an entry whose checksum or structure is wrong is reported, removed and re-solved.
"""
from __future__ import annotations

import functools
import hashlib
import marshal
import os
import platform
import warnings
from pathlib import Path
from typing import Any, Optional

import detent_rl
from detent_rl import atomic
from detent_rl.selir import ranges
from detent_rl.selir.graph import Node
from detent_rl.selir.lower import reachable
from detent_rl.selir.exec import Cond
from detent_rl.selir.program import Program, canonical
from detent_rl.selir.solution import Solution

FORMAT = 2
ENV_DIR = "DETENT_CACHE_DIR"
ENV_DISABLE = "DETENT_CACHE_DISABLE"


@functools.lru_cache(maxsize=1)
def solver_digest() -> str:
    """A hash of SelIR's own source: any change to the solver invalidates what it solved before."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cache_key(program: Program, facts: dict, **options: Any) -> str:
    text = "\n".join([
        f"selir-format={FORMAT}", f"selir-source={solver_digest()}", f"detent_rl={detent_rl.__version__}",
        f"python={platform.python_version()}", f"program={program.qualname}:{program.digest}",
        f"facts={canonical(dict(sorted(facts.items())))}",
        f"options={canonical(dict(sorted(options.items())))}",
    ])
    return hashlib.sha256(text.encode()).hexdigest()


def _ref(v: Any) -> tuple:
    return (1, v.id) if isinstance(v, Node) else (0, v)


def _deref(r: tuple, nodes: dict[int, Node]) -> Any:
    return nodes[r[1]] if r[0] else r[1]


_FIELDS = ("program_name", "program_file", "program_line", "ir_hash", "level", "facts_text", "params",
           "domains", "knobs", "axes", "candidates", "candidate_source", "default", "stats")


def dump_solution(sol: Any) -> dict:
    """A Solution as plain data (tuples, dicts, scalars): marshal-able, node references by id."""
    roots = list(sol.outputs.values()) + [c.value for c in sol.conditions] + list(sol.pin_nodes.values())
    nodes = sorted(reachable(roots).values(), key=lambda n: n.id)
    return {
        "nodes": tuple((n.id, n.op, tuple(_ref(a) for a in n.args), n.aux, n.type) for n in nodes),
        "outputs": {k: _ref(v) for k, v in sol.outputs.items()},
        "conditions": tuple((c.kind, _ref(c.value), c.line, c.file, c.text, c.message) for c in sol.conditions),
        "fields": {k: getattr(sol, k) for k in _FIELDS},
        "pin_nodes": {k: n.id for k, n in sol.pin_nodes.items()},
        "groups": tuple((tuple(pos), table) for pos, table in sol.groups),
    }


def load_solution(data: dict) -> Any:
    nodes: dict[int, Node] = {}
    for i, op, args, aux, type_ in data["nodes"]:
        nodes[i] = Node(i, op, tuple(nodes[v] if k else v for k, v in args), aux, type_, ranges.FULL)
    conds = [Cond(k, _deref(v, nodes), line, file, text, msg) for k, v, line, file, text, msg in data["conditions"]]
    return Solution(**data["fields"], outputs={k: _deref(v, nodes) for k, v in data["outputs"].items()},
                    conditions=conds, pin_nodes={k: nodes[i] for k, i in data["pin_nodes"].items()},
                    groups=[(list(pos), table) for pos, table in data["groups"]], from_cache=True)


class JITCache:
    def __init__(self, directory: Optional[os.PathLike | str] = None, enabled: Optional[bool] = None) -> None:
        if enabled is None:
            enabled = os.environ.get(ENV_DISABLE, "") in ("", "0")
        self.enabled = enabled
        self.directory = Path(directory or os.environ.get(ENV_DIR) or
                              Path.home() / ".cache" / "detent_rl" / "selir")
        self.hits = self.misses = self.corrupt = 0

    @classmethod
    def default(cls) -> "JITCache":
        return cls()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.selir"

    def load(self, key: str) -> Optional[Any]:
        if not self.enabled:
            return None
        p = self.path(key)
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        try:
            digest, _, body = raw.partition(b"\n")
            if hashlib.sha256(body).hexdigest().encode() != digest:
                raise ValueError("checksum mismatch (truncated or corrupted)")
            sol = load_solution(marshal.loads(body))
        except Exception as e:  # any damage means: re-solve, never trust the entry
            self.corrupt += 1
            warnings.warn(f"JIT cache entry {p} is corrupt ({e}); re-solving", RuntimeWarning, stacklevel=3)
            p.unlink(missing_ok=True)
            return None
        self.hits += 1
        return sol

    def store(self, key: str, sol: Any) -> None:
        if not self.enabled:
            return
        body = marshal.dumps(dump_solution(sol))
        atomic.write_bytes(self.path(key), hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
