"""The compiled selectors of one deployment in one arm, and the values that pin them.

Four arms. `stock`: the selection programs unpinned, reading the batch as engines ship them (its
linears do not use the matmul selection at all: they are cuBLAS, `models/layers.py`). `corun` (the
CoRun paper's): stock's selections and linears, made batch-invariant in the rollout by fixed shapes
instead of pins — the engine runs each prefill alone and every decode step padded to the
deployment's maximum concurrency (`rollout/engine.py`).
`detent`: pinned by the solver to the commitment tuple (`kernels/commitment.py`; the default
tuple, `detent_default`, where none is given). `det`: one conservative configuration per op, the way the
engines' deterministic modes work — no split anywhere (attention reduces a row's keys in one split,
matmul never splits K), one matmul schedule for every M, one row block — chosen here without looking
at the workload.

Every kernel call site asks `KernelSelections.get(family, **site)` for its selector once, when the
model is built (a matmul site names its n and k), and calls it with the batch's values on every
launch. The engine and the trainer build this object from the same deployment and the same
commitment-tuple file, so both run the same kernels with the same parameters.

The commitment tuple is an input and is never written. Loading one checks it: it must record this
deployment (`CommitmentTuple.check_deployment`), only the detent arm takes one, and once the model
is built every entry must belong to a site the model asked for (`check_commitment_used`). What each
site runs — the tuple's entry or the default (`detent_default`) — is kept here and handed out as a new tuple
by `resolved()`: that is the tuple a run records, and loading it reproduces the run's kernels.
"""
from __future__ import annotations

from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Optional

from detent_rl.kernels.commitment import CommitmentError, CommitmentTuple, SiteCommitment, listed
from detent_rl.kernels.programs import allreduce, attention, matmul, rows
from detent_rl.selir.cache import JITCache
from detent_rl.selir.errors import SelectionError, SelIRError
from detent_rl.selir.selector import Selector
from detent_rl.selir.solution import Solution
from detent_rl.selir.solver import solve

ARMS = ("stock", "det", "detent", "corun")
FAMILIES = {"matmul": matmul.matmul_program, "attention": attention.attention_program,
            "rmsnorm": rows.rmsnorm_program, "log_softmax": rows.log_softmax_program,
            "elementwise": rows.elementwise_program, "allreduce": allreduce.allreduce_program}
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
    # Tensor parallelism: the ranks the model is sharded over (heads, the MLP's width and the vocabulary
    # are cut into tp_size parts; each rank's attention selection sees its own heads), and the
    # all-reduce's workspaces (the largest message each custom algorithm stages).
    tp_size: int = 1
    allreduce_push_bytes: int = 16 * 1024 * 1024
    allreduce_pull_bytes: int = 128 * 1024 * 1024

    @staticmethod
    def later_defaults() -> dict:
        """Facts added after tuples were first recorded, with their defaults: what a tuple that lacks one
        was made for (CommitmentTuple.check_deployment reads it so)."""
        return {f: Deployment.__dataclass_fields__[f].default for f in TP_FIELDS}

    def facts(self, family: str, site: dict) -> dict:
        if family == "matmul":
            return {"n": site["n"], "k": site["k"], "max_m": self.max_num_tokens, "num_sms": self.num_sms,
                    "smem_bytes": self.smem_bytes, "dtype_bytes": self.dtype_bytes}
        if family == "attention":  # a rank's own heads
            return {"num_heads": self.num_heads // self.tp_size, "num_kv_heads": self.num_kv_heads // self.tp_size,
                    "head_dim": self.head_dim,
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
        if family == "allreduce":  # the model's all-reduces carry [tokens, hidden] rows
            return {"world_size": self.tp_size, "max_nbytes": self.max_num_tokens * self.hidden * self.dtype_bytes,
                    "push_workspace": self.allreduce_push_bytes, "pull_workspace": self.allreduce_pull_bytes}
        raise SelIRError(f"unknown kernel family {family!r}; known: {sorted(FAMILIES)}")


TP_FIELDS = ("tp_size", "allreduce_push_bytes", "allreduce_pull_bytes")


def site_key(family: str, site: dict) -> str:
    return family + "".join(f"[{k}={site[k]}]" for k in sorted(site))


DET_TILE_CHOICE = 1


def det_assignment(family: str, facts: dict, sol: Solution) -> tuple[dict, dict]:
    """The det arm's (pins, knobs) of one family: its conservative configuration, no split."""
    if family == "matmul":  # K in one piece (no split-K) and one schedule for every M
        pins = {"chunk": max(sol.candidates["chunk"])} if "chunk" in sol.pin_nodes else {}
        # The deterministic modes' one GEMM config (vLLM's and SGLang's batch-invariant matmul, bf16): 128 x 128 x
        # 64, 8 warps, 3 stages, groups of 8 (the 8192 bucket's choice 1). The bucket's default 128 x 256 Triton
        # tile spills 1,668 bytes a thread (Triton 3.6, sm_90a: bench/sm90_compile.py), a weaker baseline.
        return pins, {"schedule_by_m": False, "tile_8192": DET_TILE_CHOICE}
    if family == "attention":  # causal tiles for prefill and decode alike; one split covers the context
        block_n = attention.triton_tile.fn(True)[1]
        span = -(-facts["max_context"] // block_n) * block_n
        pins = {"block_n": block_n, "num_splits": 1, "split_size": span}  # the cut may derive some of these
        return {k: v for k, v in pins.items() if k in sol.pin_nodes}, {"split_stride": 0}
    if family == "rmsnorm" and rows.pow2_at_least.fn(facts["hidden"]) > 256:
        return {"block": 256}, {}  # the large-batch block for every batch
    if family == "log_softmax":  # likewise
        return {"block": 1024}, {}
    if family == "allreduce":  # one fixed-order algorithm for every message: the detent default's
        return detent_default(family, sol, facts)
    return {}, {}  # a selection with no pin reads no batch value


def detent_default(family: str, sol: Solution, facts: dict) -> tuple[dict, dict]:
    """The detent arm's (pins, knobs) where the tuple names none: the solver's default tuple, except
    for matmul and RMSNorm. There the solver's choice (the pin's most frequent value over the row
    count) is the large-batch one — matmul's K in one piece, RMSNorm's 256-lane block — which starves
    a decode step (matmul: of CTAs; RMSNorm: a one-row step walks the row in four chunks at 3.3 µs a
    call where the 1,024-lane block takes 1.75 µs, measured on the H200). The default takes what
    the stock selection gives a one-row decode instead; large batches are memory-bound either way
    (matmul runs the same chunks in sequence). The tuner trades the two ends per workload."""
    pins, knobs = sol.split(sol.default)
    if family == "matmul" and "chunk" in pins:
        pins = {"chunk": sol.stock()(1).chunk}
    if family == "rmsnorm" and "block" in pins:
        pins = {"block": sol.stock()(1).block}
    if family == "attention" and "split_size" in pins:
        pins = {**pins, **attention_split_pins(sol, facts["max_context"], pins, knobs)}
    if family == "allreduce" and not ordered_allreduce(facts, pins):
        custom = [dict(zip(sol.axes, a)) for a in sol.legal if ordered_allreduce(facts, dict(zip(sol.axes, a)))]
        if not custom:
            raise SelIRError(f"no all-reduce algorithm with a fixed order holds every message up to "
                             f"{facts['max_nbytes']} bytes on {facts['world_size']} ranks (NCCL's order follows the "
                             f"message size): enlarge the workspaces or lower max_num_tokens")
        pins, knobs = sol.split(tuple(custom[0][a] for a in sol.axes))
    return pins, knobs


def ordered_allreduce(facts: dict, pins: dict) -> bool:
    """Whether a pinned all-reduce sums in an order of its own: any algorithm on two ranks (two values,
    one add), a custom one from three up (NCCL's order follows its chunking of the message)."""
    return facts["world_size"] <= 2 or pins.get("algorithm") != "nccl"


ATTENTION_SPLIT = 1024  # keys per split in the detent default: the most (a long context's)
ATTENTION_SPLIT_MIN = 256  # the fewest (a short context's)
ATTENTION_SPLITS = 4  # a short context's splits


def attention_split_pins(sol: Solution, context: int, pins: dict, knobs: dict) -> dict:
    """The default's KV split: every row's keys cut every `size` positions, a quarter of the deployment's
    context (ATTENTION_SPLITS) rounded up to 64 keys, from ATTENTION_SPLIT_MIN to ATTENTION_SPLIT (more where
    the context needs more than MAX_SPLITS splits). The solver's default is one split over the whole context,
    which runs a decode step on one CTA per (sequence, KV head), however few sequences:
    - long context (0.5B, batch 2, 12,000-token prompts; H200): attention took 5.96 ms a step in one split
      and 0.78 ms in 1,024-key splits (0.71-0.77 ms at 256-512, with costlier combines);
    - short context, online serving (0.5B, the bench's Poisson case, contexts to 784; H100, session 40): in
      one split attention took 16.8 µs a call against stock's 7.9 (its FA3 heuristic splits a small batch),
      1.11-1.33x stock's p50; in 256-key splits 8.8 µs against 9.3, 1.09x. Batch-32 decode (rows to 384 keys)
      took 1.109 ms a step in 256-key splits and 1.107 in 512-key ones (one split a row), 0.93x stock's.
      On the H200 (session 41) the p50 was 0.87x stock's in 256-key splits, 1.14x in one;
    - the GRPO batch (256 rows to 456 keys, two splits each; H100, session 41): its decode step 1.01x stock's,
      against 0.92x in one split (the combine's launch where the rows already fill the SMs): its tuple pins one.
    Rows shorter than the split still reduce in one; the partial outputs hold ATTENTION_SPLITS splits of every
    token at short contexts, and the context / ATTENTION_SPLIT at long ones. Kept only where legal."""
    fewest = -(-context // attention.MAX_SPLITS)
    quarter = -(-context // ATTENTION_SPLITS)
    size = max(min(max(ATTENTION_SPLIT_MIN, -(-quarter // 64) * 64), ATTENTION_SPLIT), -(-fewest // 64) * 64)
    if size >= pins["split_size"]:
        return {}
    split = {"split_size": size, "num_splits": -(-context // size)}
    try:
        sol.check_legal({**pins, **split}, knobs)
    except (SelIRError, SelectionError):
        return {}
    return split


class KernelSelections:
    """Compiled selectors for every call site of one deployment, in one arm (stock, det or detent).

    `commitment` (detent arm only) pins the sites it has an entry for; the others take the solver's
    default tuple, as they do with no tuple at all. It must record `deployment`: otherwise
    CommitmentError, naming each differing fact."""

    def __init__(self, deployment: Deployment, arm: str = "detent",
                 commitment: Optional[CommitmentTuple] = None, cache: Optional[JITCache] = None) -> None:
        if arm not in ARMS:
            raise SelIRError(f"unknown arm {arm!r}; expected one of {ARMS}")
        if commitment is not None:
            if arm != "detent":
                raise CommitmentError(f"{commitment.label()} pins the detent arm, and the {arm} arm would "
                                      f"ignore it: run the detent arm, or load no tuple")
            commitment.check_deployment(asdict(deployment), Deployment.later_defaults())
        self.deployment = deployment
        self.arm = arm
        self.commitment = commitment  # the input, read only; None: the default tuple
        self.cache = cache
        self._selectors: dict[str, Selector] = {}
        self._sites: dict[str, tuple[str, dict]] = {}  # site key -> (family, site)
        self._recording: Optional[dict[str, Counter]] = None  # the innermost `recording()`'s counts
        self._solutions: dict[str, Solution] = {}
        self._resolved: dict[str, SiteCommitment] = {}  # site key -> the pins and knobs it runs with

    @property
    def pinned(self) -> bool:
        """Whether the selectors are pinned (det, detent): one value of each pinned knob for every call of the
        deployment. The stock and corun arms read the batch (corun's invariance comes from fixed shapes)."""
        return self.arm not in ("stock", "corun")

    def get(self, family: str, **site: Any) -> Selector:
        """The site's selector (built on first request, then the same object)."""
        key = site_key(family, site)
        sel = self._selectors.get(key)
        if sel is None:
            sel = self._selectors[key] = self._build(family, site, key)
            self._sites[key] = (family, dict(site))
        return sel

    def sites(self) -> dict[str, tuple[str, dict]]:
        """Every site asked for so far: its key -> (family, site)."""
        return {key: (family, dict(site)) for key, (family, site) in self._sites.items()}

    @contextmanager
    def recording(self) -> Iterator[dict[str, Counter]]:
        """While inside, every site's selector calls are counted by their arguments: the distinct
        calls of a workload and how often each occurred (the tuner's profile), by site key."""
        calls = {key: Counter() for key in self._selectors}
        outer, self._recording = self._recording, calls
        try:
            with ExitStack() as stack:
                for key, selector in self._selectors.items():
                    stack.enter_context(selector.counting(calls[key]))
                yield calls
        finally:
            self._recording = outer

    def replayed(self, calls: dict[str, Counter]) -> None:
        """Count `calls` into the active recording (if any) as if made again: a CUDA graph replays the
        kernels its capture selected without calling the selectors."""
        if self._recording is not None:
            for key, counter in calls.items():
                self._recording[key].update(counter)

    def solution(self, family: str, **site: Any) -> Solution:
        """The site's solved selection program (its pins, knobs and legal assignments), solved once."""
        if family not in FAMILIES:
            raise SelIRError(f"unknown kernel family {family!r}; known: {sorted(FAMILIES)}")
        key = site_key(family, site)
        sol = self._solutions.get(key)
        if sol is None:
            facts = self.deployment.facts(family, site)
            sol = self._solutions[key] = solve(FAMILIES[family], facts, cache=self.cache)
        return sol

    def resolved(self) -> CommitmentTuple:
        """A new tuple of what every site asked for so far runs with — the loaded tuple's entries and
        the solver's defaults alike — recording this deployment. A model asks for all its sites when
        it is built, so `model.selections.resolved()` is the model's whole tuple: save it beside a
        run (`.save(path)`, `.sha256()`), and loading it into the detent arm runs the same kernels.
        The det arm's is det's assignment (loaded into detent, it runs det's kernels). The stock arm
        pins nothing and has no tuple: CommitmentError."""
        if not self.pinned:
            raise CommitmentError(f"the {self.arm} arm pins nothing (its selectors read the batch), so it has no "
                                  "commitment tuple; check `selections.arm` before asking for one")
        return CommitmentTuple(dict(self._resolved), asdict(self.deployment))

    def check_commitment_used(self) -> None:
        """Refuse a tuple with entries for sites no one asked for: a tuple made for another model
        would otherwise fall back to defaults silently. Called once the model has asked for all
        its sites (the end of `CausalLM.__init__`)."""
        if self.commitment is None:
            return
        # "sglang.*" sites are the SGLang plugin's (rollout/sglang_plugin.py), which reads the same file
        unknown = [key for key in self.commitment.sites if key not in self._selectors and not key.startswith("sglang.")]
        if unknown:
            raise CommitmentError(f"{self.commitment.label()} has entries for sites this model does not have: "
                                  f"{listed(unknown)}; the model's sites: {listed(sorted(self._selectors))}")

    def _build(self, family: str, site: dict, key: str) -> Selector:
        sol = self.solution(family, **site)
        if not self.pinned:  # corun: the stock selection, made invariant by fixed shapes
            return sol.stock()
        if self.arm == "det":
            facts = self.deployment.facts(family, site)
            sel = sol.commit(*det_assignment(family, facts, sol))
            if family == "attention":
                one = sel(1, 1, 1, 1)
                if one.num_splits != 1 or one.split_size < facts["max_context"]:
                    raise SelIRError(f"det attention for {facts} splits the KV: {one}")
        else:
            entry = self.commitment.sites.get(key) if self.commitment is not None else None
            if entry is None:  # no committed value: the default tuple
                sel = sol.commit(*detent_default(family, sol, self.deployment.facts(family, site)))
            else:
                sel = sol.commit(dict(entry.pins), dict(entry.knobs))
                if family == "allreduce" and not ordered_allreduce(self.deployment.facts(family, site), sel.pins):
                    raise CommitmentError(f"{self.commitment.label()}: sites.{key} pins NCCL's all-reduce over "
                                          f"{self.deployment.tp_size} ranks, whose order follows the message size")
        self._resolved[key] = SiteCommitment(sel.pins, sel.knobs)  # commit fills pins an entry left out
        return sel
