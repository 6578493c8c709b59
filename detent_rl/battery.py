"""`python -m detent_rl.battery`: the batch-invariance battery of the DETENT evaluation.

The cells themselves are drawn in `battery_cells.py`; this module runs and judges them. A cell runs one
target request twice, in a reference batch state and in a changed one, on the same model, and compares
the bits of the target's first 16 output logprobs (and its tokens). Each cell is run twice: greedy
(T = 0) and seeded sampling (T = 1). Comparing logprob bits also catches a logit change that leaves the
tokens alone. The cells, 26 as in the paper plus 9 strong cells and one rollout-vs-rescore cell:

- rerun (2): the same batch again on a fresh engine (reproducibility);
- cobatch (14): other co-running requests, other chunking and token budgets, late admission, pages
  that held other requests' keys, a co-batched request sharing the target's prefix;
- row (4): the same batch with the target moved to another row;
- prefix (6): 1 to 6 full blocks of the target's prompt already in the prefix cache, left by an
  earlier request sharing that prefix; the hit is checked through `Sequence.num_cached`;
- strong (9): 1, 8 or 32 short, long or mixed neighbours, the target at a random row;
- rescore (1): the rollout's logprobs against the trainer's one-shot prefill (`Engine.rescore`).

Every run gets a fresh engine, so no cell sees another's cache. With the detent or det selections
every cell must pass. The stock arm is the negative control: its selection reads the batch, so
some cells must fail, or the battery proves nothing. The exit status says whether every arm run did
what it must (`verdict`): 0 when each pinned arm passes every cell and stock fails at least one.
Models are named built-ins (`detent_rl.models.builtin`: seeded random weights scaled so that greedy
decoding does not collapse into one repeated token, or SmolLM2's real weights) or checkpoint
directories, all loaded from disk.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from detent_rl.atomic import write_text
from detent_rl.battery_cells import (NUM_COMPARED, BatteryError, Cell, Request, Run, build_cells, concurrency,
                                     select_cells, target_prompt)
from detent_rl.kernels.selections import ARMS
from detent_rl.models.builtin import BUILTINS, SMOLLM2, checkpoint_of
from detent_rl.models.config import ModelConfig, ModelConfigError
from detent_rl.models.gguf import GGUFError, ModelFetchError
from detent_rl.models.loader import WeightsError, load_model
from detent_rl.models.model import CausalLM
from detent_rl.models.parallel import TensorParallel
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams

MODES = {"T=0": 0.0, "T=1": 1.0}  # greedy, and seeded sampling at temperature 1
TARGET_SEED = 20240601
# Steps stay within 256 tokens by default (the cells' batches are small; a tighter budget splits their
# prefills into more chunks, which the cells are meant to exercise); every arm runs the same limits.
DEFAULT_STEP_TOKENS = 256
PAGE_SIZE = 16
NEGATIVE_CONTROL = "stock"  # the arm whose selection reads the batch: it must fail some cell
ALL_ARMS = ("stock", "det", "detent")  # `--arm all`; corun is run by name
CORUN = "corun"  # fixed shapes, no pins: no prefix cache (its cells do not apply), rescore not promised
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# ---------------------------------------------------------------------------------------------
# models

def checkpoint_dir(model: str) -> Path:
    """The checkpoint directory of `model`: a built-in's (made or converted once), or a path."""
    try:
        return checkpoint_of(model)
    except ValueError as e:
        raise BatteryError(f"model {e}") from None


def model_config(model: str) -> ModelConfig:
    """The config of `model`; a random-weight built-in's from the registry, without making its weights."""
    config = BUILTINS[model].config if model in BUILTINS else None
    if config is not None:
        return ModelConfig.from_dict(config, source=f"built-in model {model}")
    return ModelConfig.from_file(checkpoint_dir(model))


def open_model(model: str, arm: str, device: str, dtype: torch.dtype, tp: Optional[TensorParallel] = None,
               max_batch: int = 256) -> CausalLM:
    """`model`'s checkpoint (a built-in's or a directory) loaded for `arm`, on `device` in `dtype` (this
    rank's part with `tp`), for a deployment of at most `max_batch` concurrent requests."""
    return load_model(checkpoint_dir(model), arm, device, dtype, page_size=PAGE_SIZE, tp=tp, max_batch=max_batch)


# ---------------------------------------------------------------------------------------------
# running and comparing

@dataclass(frozen=True)
class Outcome:
    """The target's first NUM_COMPARED tokens and logprobs in one run, and its prefix hit."""
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached: int


@dataclass
class Comparison:
    mode: str
    first_diff: Optional[int]  # the first position whose token or logprob bits differ; None: equal
    detail: str = ""
    error: bool = False  # a run raised (`detail` says what): the cell fails, the battery goes on

    @property
    def passed(self) -> bool:
        return self.first_diff is None and not self.error

    @property
    def status(self) -> str:
        return "ERROR" if self.error else "pass" if self.passed else f"FAIL@{self.first_diff}"


@dataclass
class CellResult:
    cell: str
    group: str
    arm: str
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)


def _fp32_hex(x: float) -> str:
    return f"0x{struct.unpack('<I', struct.pack('<f', x))[0]:08x}"


def compare(ref: Outcome, got: Outcome, mode: str) -> Comparison:
    """Tokens and logprob bits position by position (logprobs are fp32 values held in floats)."""
    for i in range(NUM_COMPARED):
        if ref.tokens[i] != got.tokens[i]:
            return Comparison(mode, i, f"token {ref.tokens[i]} vs {got.tokens[i]}")
        a, b = ref.logprobs[i], got.logprobs[i]
        if struct.pack("<d", a) != struct.pack("<d", b):
            return Comparison(mode, i, f"logprob {a!r} ({_fp32_hex(a)}) vs {b!r} ({_fp32_hex(b)})")
    return Comparison(mode, None)


class Battery:
    """Runs cells on one model (one arm); each distinct (run, mode) is executed once."""

    def __init__(self, model: CausalLM, step_tokens: int = DEFAULT_STEP_TOKENS, seed: int = 0) -> None:
        limit = model.selections.deployment.max_num_tokens
        if not 1 <= step_tokens <= limit:
            raise BatteryError(f"step budget {step_tokens} is outside 1..{limit} (the deployment's max_num_tokens)")
        self.model, self.step_tokens = model, step_tokens
        self.target = target_prompt(model.config.vocab_size, model.page_size, seed)
        self._outcomes: dict[tuple[Run, str], Outcome] = {}

    def outcome(self, run: Run, mode: str) -> Outcome:
        key = (run, mode)
        if key not in self._outcomes:
            self._outcomes[key] = self._execute(run, mode)
        return self._outcomes[key]

    def _execute(self, run: Run, mode: str) -> Outcome:
        page = self.model.page_size
        target = Request(self.target, SamplingParams(seed=TARGET_SEED, temperature=MODES[mode],
                                                     max_tokens=NUM_COMPARED))
        batch = list(run.neighbours)
        batch.insert(run.row, target)
        every = [r for call in run.before for r in call] + batch
        blocks = run.num_blocks or sum(-(-(len(r.prompt) + r.params.max_tokens) // page) for r in every) + 4
        budget = run.max_num_tokens or self.step_tokens
        engine = Engine(self.model, num_blocks=blocks, max_num_seqs=run.max_num_seqs, max_num_tokens=budget,
                        chunk_size=run.chunk_size or budget)
        for call in run.before:
            engine.generate([list(r.prompt) for r in call], [r.params for r in call])
        seq = engine.generate([list(r.prompt) for r in batch], [r.params for r in batch])[run.row]
        if run.expect_cached is not None and seq.num_cached != run.expect_cached:
            raise BatteryError(f"{run}: the target found {seq.num_cached} prompt tokens in the prefix cache, "
                               f"expected {run.expect_cached}; the cell would not test what it says")
        if len(seq.completion) < NUM_COMPARED:
            raise BatteryError(f"the target stopped after {len(seq.completion)} tokens, {NUM_COMPARED} are compared")
        logprobs = engine.rescore(seq) if run.rescore else seq.logprobs
        return Outcome(tuple(seq.completion[:NUM_COMPARED]), tuple(logprobs[:NUM_COMPARED]), seq.num_cached)

    def run_cell(self, cell: Cell) -> CellResult:
        result = CellResult(cell.name, cell.group, self.model.selections.arm)
        for mode in MODES:
            try:
                comparison = compare(self.outcome(cell.reference, mode), self.outcome(cell.changed, mode), mode)
            except Exception as e:  # an engine that crashes in one batch state fails that cell only
                comparison = Comparison(mode, None, f"{type(e).__name__}: {e}", error=True)
            result.comparisons.append(comparison)
        return result

    def reference_tokens(self) -> tuple[int, ...]:
        """The target's greedy tokens alone: a few distinct ones mean a degenerate model."""
        return self.outcome(Run(), "T=0").tokens


def run_battery(model: CausalLM, cells: Sequence[Cell], *, step_tokens: int = DEFAULT_STEP_TOKENS, seed: int = 0,
                progress: Optional[Callable[[CellResult], None]] = None) -> list[CellResult]:
    """Every cell on `model` (its arm is the model's selections'); `progress` sees each result."""
    battery = Battery(model, step_tokens, seed)
    results = []
    for cell in cells:
        results.append(battery.run_cell(cell))
        if progress:
            progress(results[-1])
    return results


# ---------------------------------------------------------------------------------------------
# report and CLI

def format_row(r: CellResult) -> str:
    status = [c.status for c in r.comparisons]
    first = next((c for c in r.comparisons if not c.passed), None)
    note = f"{first.mode}: {first.detail}" if first else ""
    return f"{r.cell:<25} {r.group:<8} {r.arm:<7} {status[0]:<8} {status[1]:<8} {note}".rstrip()


def header() -> str:
    return f"{'cell':<25} {'group':<8} {'arm':<7} {'T=0':<8} {'T=1':<8} first difference"


def verdict(results: Sequence[CellResult]) -> tuple[bool, str]:
    """Whether every arm in `results` did what it must, and a line saying why: a pinned arm (det,
    detent) passes every cell; the negative control (stock) fails at least one by changed bits, or the
    cells chosen cannot tell batch-invariant selection from the batch-reading one. A cell whose run
    raised (ERROR) proves nothing either way, so it fails the verdict in any arm."""
    arms: dict[str, list[CellResult]] = {}
    for r in results:
        arms.setdefault(r.arm, []).append(r)
    if not arms:
        return False, "verdict: FAIL: no cell was run"
    good, bad = [], []
    for arm, rs in arms.items():
        errors = [r.cell for r in rs if any(c.error for c in r.comparisons)]
        differ = [r.cell for r in rs if not r.passed and r.cell not in errors]
        if errors:
            bad.append(f"{arm}: {len(errors)} of {len(rs)} cells raised ({_names(errors)})")
        elif arm == NEGATIVE_CONTROL and not differ:
            bad.append(f"{arm} (the negative control) passes all {len(rs)} cells: these cells cannot tell a "
                       "selection that reads the batch from a pinned one")
        elif arm == NEGATIVE_CONTROL:
            good.append(f"{arm} fails {len(differ)} of {len(rs)} cells, as the negative control must")
        elif arm == CORUN:
            rescore = {r.cell for r in rs if r.group == "rescore"}
            rollout = [c for c in differ if c not in rescore]
            if rollout:
                bad.append(f"{arm}: {len(rollout)} of {len(rs)} cells change the target's bits ({_names(rollout)})")
            else:
                good.append(f"{arm} passes all {len(rs) - len(rescore)} rollout cells"
                            + ("; its rollout and the trainer's prefill differ (rescore), as CoRun's do"
                               if set(differ) & rescore else ""))
        elif differ:
            bad.append(f"{arm}: {len(differ)} of {len(rs)} cells change the target's bits ({_names(differ)})")
        else:
            good.append(f"{arm} passes all {len(rs)} cells")
    if bad:
        return False, "verdict: FAIL: " + "; ".join(bad) + ("; " + "; ".join(good) if good else "")
    return True, "verdict: OK: " + "; ".join(good)


def _names(cells: list[str], most: int = 4) -> str:
    return ", ".join(cells[:most]) + (f", ... ({len(cells) - most} more)" if len(cells) > most else "")


def parse_arms(text: str) -> list[str]:
    arms = list(ALL_ARMS) if text == "all" else [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise BatteryError(f"unknown arm(s) {bad or [text]}; expected one of {', '.join(ARMS)}, a comma list, or all")
    return arms


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m detent_rl.battery", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 when every arm run did what it must: each pinned arm (det, detent) passes every "
        "cell and stock, the negative control, fails at least one cell by changed bits (so `--arm stock` "
        "alone exits 0 when stock fails a cell); 1 otherwise, also when a cell's run raised (the last line, "
        "`verdict: ...`, says why); 2 for bad options.")
    ap.add_argument("--arm", default="detent",
                    help="stock, det, detent, a comma list, or all (default detent); stock is the negative "
                    "control: it must fail a cell")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default="tiny-qwen2",
                    help=f"a built-in model ({', '.join(BUILTINS)}; {SMOLLM2} has real weights, converted once "
                    f"from its GGUF, the others seeded random ones) or an HF checkpoint directory")
    ap.add_argument("--dtype", choices=tuple(DTYPES),
                    help="default: fp32 on cpu (where stock's fp32 CPU GEMM changes bits with M), bf16 on cuda")
    ap.add_argument("--cells", help="comma-separated cell names, groups or glob patterns (default: all)")
    ap.add_argument("--step-tokens", type=int, default=DEFAULT_STEP_TOKENS, help="token budget of an engine step")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; 0 keeps torch's default)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the cells' prompts (a built-in's weights are fixed by its name)")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor-parallel ranks (processes; gloo on cpu, NCCL and a GPU each on cuda): every rank "
                    "runs every cell in step, rank 0 reports (default 1)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--list", action="store_true", help="list the cells and exit")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except (BatteryError, ModelConfigError, WeightsError, GGUFError, ModelFetchError) as e:
        print(f"battery: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    arms = parse_arms(args.arm)
    config = model_config(args.model)
    cells = select_cells(build_cells(config.vocab_size, PAGE_SIZE, args.seed), args.cells)
    if args.list:
        for c in cells:
            print(f"{c.name:<25} {c.group:<8} {c.what}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BatteryError("--device cuda: no CUDA device is available")
    if args.tp < 1:
        raise BatteryError(f"--tp {args.tp}: at least one rank")
    if args.tp > 1:
        if args.device == "cuda" and torch.cuda.device_count() < args.tp:
            raise BatteryError(f"--tp {args.tp} on cuda: a GPU per rank, and this machine has "
                               f"{torch.cuda.device_count()}")
        checkpoint_dir(args.model)  # made or converted once, before the ranks read it
        return _spawn_ranks(args, arms, cells)
    return _run(args, arms, cells)


def _spawn_ranks(args: argparse.Namespace, arms: list[str], cells: list[Cell]) -> int:
    """`_run` on `args.tp` ranks in step (each its own process and part of the model); rank 0's status."""
    import tempfile
    import torch.multiprocessing as mp
    from detent_rl.weight_sync import sync_address
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(args, arms, cells, sync_address(), tmp), nprocs=args.tp, join=True)
        return int(Path(tmp, "status").read_text())


def _rank(rank: int, args: argparse.Namespace, arms: list[str], cells: list[Cell], address: str, tmp: str) -> None:
    import os
    import torch.distributed as dist
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method=f"tcp://{address}", rank=rank,
                            world_size=args.tp)
    if rank != 0:  # rank 0 reports
        sys.stdout = open(os.devnull, "w")
    try:
        status = _run(args, arms, cells, TensorParallel.from_group())
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(tmp, "status").write_text(str(status))


def _run(args: argparse.Namespace, arms: list[str], cells: list[Cell], tp: Optional[TensorParallel] = None) -> int:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype_name = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    device = f"cuda:{tp.rank}" if tp is not None and args.device == "cuda" else args.device
    over = f" over {tp.size} tensor-parallel ranks" if tp is not None else ""
    print(f"battery: {args.model} on {args.device}{over} in {dtype_name}, {len(cells)} cells x {len(MODES)} modes, "
          f"arms {', '.join(arms)}")
    print(header())
    results, summary = [], []
    for arm in arms:
        start = time.perf_counter()
        model = open_model(args.model, arm, device, DTYPES[dtype_name], tp,
                           **({"max_batch": concurrency(cells)} if arm == CORUN else {}))
        battery = Battery(model, args.step_tokens, args.seed)
        arm_results = []
        arm_cells = [c for c in cells if not (arm == CORUN and c.group == "prefix")]  # no prefix cache
        for cell in arm_cells:
            arm_results.append(battery.run_cell(cell))
            print(format_row(arm_results[-1]), flush=True)
        ref = battery.reference_tokens()
        failed = sum(not r.passed for r in arm_results)
        summary.append(f"{arm}: {len(arm_cells) - failed}/{len(arm_cells)} cells pass, {failed} fail "
                       f"({time.perf_counter() - start:.0f} s; the target's greedy tokens: {len(set(ref))} "
                       f"distinct of {len(ref)})")
        results += arm_results
    print("\n".join(summary))
    ok, why = verdict(results)
    if args.json and (tp is None or tp.rank == 0):
        write_text(args.json, json.dumps({
            "model": args.model, "device": args.device, "dtype": dtype_name, "arms": arms,
            "tp": tp.size if tp is not None else 1,
            "cells": [{"name": c.name, "group": c.group, "what": c.what} for c in cells],
            "results": [asdict(r) | {"passed": r.passed} for r in results], "summary": summary,
            "verdict": {"ok": ok, "why": why}}, indent=1))
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
