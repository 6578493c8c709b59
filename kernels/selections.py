"""The compiled selectors of one deployment in one arm, and the commitment tuple that pins them.

Three arms. `stock`: the selection programs unpinned, reading the batch as engines ship them.
`detent`: pinned by the solver to the commitment tuple (the solver's default tuple where the file
has no entry yet). `det`: one conservative configuration per op, the way the engines' deterministic
modes work — no split anywhere (attention reduces a row's keys in one split, matmul never splits
K), one matmul tile for every M, one row block — chosen here without looking at the workload.

Every kernel call site asks `KernelSelections.get(family, **site)` for its selector once (a matmul
site names its n and k) and calls it with the batch's values on every launch. The engine and the
trainer build this object from the same deployment and the same commitment-tuple file, so both
run the same kernels with the same parameters.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from detent_rl.kernels.programs import attention, matmul, rows
from detent_rl.selir.cache import JITCache
from detent_rl.selir.errors import SelIRError
from detent_rl.selir.selector import Selector
from detent_rl.selir.solution import Solution
from detent_rl.selir.solver import solve

ARMS = ("stock", "det", "detent")
FAMILIES = {"matmul": matmul.matmul, "attention": attention.attention, "rmsnorm": rows.rmsnorm,
            "log_softmax": rows.log_softmax, "elementwise": rows.elementwise}
# Selection facts of an H200 (132 SMs, 227 KiB shared memory per block); also what the CPU path
# assumes, so that CPU runs select the way a GPU deployment of the same model would.
H200 = {"num_sms": 132, "smem_bytes": 227 * 1024}


@dataclass(frozen=True)
class Deployment:
    """What the selection programs read as deployment facts, fixed before serving."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    dtype_bytes: int = 2
    page_size: int = 16
    max_context: int = 4096
    max_batch: int = 256
    max_num_tokens: int = 8192
    num_sms: int = H200["num_sms"]
    smem_bytes: int = H200["smem_bytes"]

    def facts(self, family: str, site: dict) -> dict:
        if family == "matmul":
            return {"n": site["n"], "k": site["k"], "max_m": self.max_num_tokens,
                    "smem_bytes": self.smem_bytes, "dtype_bytes": self.dtype_bytes}
        if family == "attention":
            return {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                    "num_sms": self.num_sms, "page_size": self.page_size, "max_context": self.max_context,
                    "max_batch": self.max_batch, "max_num_tokens": self.max_num_tokens,
                    "smem_bytes": self.smem_bytes, "dtype_bytes": self.dtype_bytes}
        if family == "rmsnorm":
            rows = self.max_num_tokens * site.get("rows_per_token", 1)
            return {"hidden": site.get("hidden", self.hidden), "max_rows": rows}
        if family == "log_softmax":
            return {"vocab": self.vocab, "max_rows": self.max_num_tokens}
        if family == "elementwise":
            return {"width": site["width"], "max_rows": self.max_num_tokens}
        raise SelIRError(f"unknown kernel family {family!r}; known: {sorted(FAMILIES)}")


def site_key(family: str, site: dict) -> str:
    return family + "".join(f"[{k}={site[k]}]" for k in sorted(site))


class CommitmentTuple:
    """Pins and knobs per call site: `{"matmul[k=896][n=1152]": {"pins": {...}, "knobs": {...}}}`."""

    def __init__(self, entries: Optional[dict] = None, deployment: Optional[dict] = None) -> None:
        self.entries: dict[str, dict] = dict(entries or {})
        self.deployment = deployment

    @classmethod
    def load(cls, path: os.PathLike | str) -> "CommitmentTuple":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SelIRError(f"commitment tuple {p}: cannot be read ({e})") from e
        if not isinstance(data, dict) or not isinstance(data.get("sites"), dict):
            raise SelIRError(f"commitment tuple {p}: expected an object with a 'sites' object")
        for key, entry in data["sites"].items():
            extra = sorted(set(entry) - {"pins", "knobs"})
            if extra:
                raise SelIRError(f"commitment tuple {p}: sites.{key} has unknown keys {extra}")
        return cls(data["sites"], data.get("deployment"))

    def save(self, path: os.PathLike | str) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"deployment": self.deployment, "sites": self.entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, p)


def det_assignment(family: str, facts: dict, sol: Solution) -> tuple[dict, dict]:
    """The det arm's (pins, knobs) of one family: its conservative configuration, no split."""
    if family == "matmul":  # the largest tile that fits, for every M; split-K never
        for bucket in sorted(matmul.GEMM_TILES, reverse=True):
            if matmul.GEMM_TILES[bucket].split_k == 1 and sol.witness({"bucket": bucket}, {"pad_m": 1}) is None:
                return {"bucket": bucket}, {"pad_m": 1}
        raise SelIRError(f"matmul {facts}: no tile without split-K fits")
    if family == "attention":  # causal tiles for prefill and decode alike; one split covers the context
        block_n = attention.triton_tile.fn(True)[1]
        span = -(-facts["max_context"] // block_n) * block_n
        pins = {"is_decode": False, "num_splits": 1, "split_size": span}  # the cut may derive some of these
        return {k: v for k, v in pins.items() if k in sol.pin_nodes}, {"split_stride": 0}
    if family == "rmsnorm" and rows.pow2_at_least.fn(facts["hidden"]) > 256:
        return {"block": 256}, {}  # the large-batch block for every batch
    if family == "log_softmax":  # likewise
        return {"block": 1024}, {}
    return {}, {}  # a selection with no pin reads no batch value


class KernelSelections:
    """Compiled selectors for every call site of one deployment, in one arm (stock, det or detent)."""

    def __init__(self, deployment: Deployment, arm: str = "detent",
                 commitment: Optional[CommitmentTuple] = None, cache: Optional[JITCache] = None) -> None:
        if arm not in ARMS:
            raise SelIRError(f"unknown arm {arm!r}; expected one of {ARMS}")
        self.deployment = deployment
        self.arm = arm
        self.commitment = commitment or CommitmentTuple(deployment=asdict(deployment))
        self.cache = cache
        self._selectors: dict[str, Selector] = {}

    def get(self, family: str, **site: Any) -> Selector:
        key = site_key(family, site)
        sel = self._selectors.get(key)
        if sel is None:
            sel = self._selectors[key] = self._build(family, site, key)
        return sel

    def _build(self, family: str, site: dict, key: str) -> Selector:
        if family not in FAMILIES:
            raise SelIRError(f"unknown kernel family {family!r}; known: {sorted(FAMILIES)}")
        facts = self.deployment.facts(family, site)
        sol = solve(FAMILIES[family], facts, cache=self.cache)
        if self.arm == "stock":
            return sol.stock()
        if self.arm == "det":
            sel = sol.commit(*det_assignment(family, facts, sol))
            if family == "attention":
                one = sel(1, 1, 1, 1)
                if one.num_splits != 1 or one.split_size < facts["max_context"]:
                    raise SelIRError(f"det attention for {facts} splits the KV: {one}")
            return sel
        entry = self.commitment.entries.get(key)
        if entry is None:  # no committed value yet: the solver's default tuple, recorded
            pins, knobs = sol.split(sol.default)
            self.commitment.entries[key] = {"pins": pins, "knobs": knobs}
            return sol.commit(pins, knobs)
        return sol.commit(entry.get("pins", {}), entry.get("knobs", {}))
