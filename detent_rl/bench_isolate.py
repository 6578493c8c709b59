"""`python -m detent_rl.bench --isolate`: each run of a round (one arm's model load and its cases) in a process of its
own, the way a deployment runs one engine a process.

In one process an arm's run meets whatever the runs before it left there: the caching allocator's blocks, cuBLAS's
handles and workspaces, compiled kernels, the garbage collector's objects. The rounds alternate which arm runs first,
and the paired ratios then cancel a drift of the machine, but not an effect that only some arms feel. On an H100,
stock's batch-1 step took ~10 % longer after any other run in its process than as its first, the tuned arm's ~2 %
(docs/BENCHMARKS.md, sessions 57 and 59). Isolated, every run is its process's first, and on a CUDA device that is
the bench's default (`--isolate auto`).

The parent plans each round as `run` does (`planned_runs`: the same order, the same rotation). It starts the bench
once per run with `--only K --first I --rounds 1`, with the round's cases and, after the first round's first stock run,
that run's Poisson rate. Then it merges the children's results into the round `run` would have returned. A child
that fails stops the round, with its command named.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

from detent_rl.bench_report import time_vs_stock


def child_command(argv: list[str], first: int, only: int, cases: list[str], poisson_rate: Optional[float],
                  folder: Path) -> list[str]:
    """The bench's own command line with the run's settings appended (argparse keeps an option's last value)."""
    cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", "detent_rl.bench", *argv,
           "--rounds", "1", "--first", str(first), "--only", str(only), "--cases", ",".join(cases),
           "--out", str(folder)]
    return cmd + (["--poisson-rate", repr(poisson_rate)] if poisson_rate is not None else [])


def merge_run(into: dict, child: dict) -> dict:
    """A child's results added to the round's: its arms' results by case (of stock's runs under each PDL setting,
    the faster stays the baseline, as in `run`), its stock runs, and the Poisson rate if the round had none."""
    for case, arms in child["cases"].items():
        held_case = into["cases"].setdefault(case, {})
        for name, r in arms.items():
            held = held_case.get(name)
            if held is not None and time_vs_stock(case, r, held) >= 1.0:
                continue
            held_case[name] = r
    for case, runs in child.get("stock_runs", {}).items():
        into.setdefault("stock_runs", {}).setdefault(case, []).extend(runs)
    if "poisson_rate_per_s" in child:
        into.setdefault("poisson_rate_per_s", child["poisson_rate_per_s"])
    return into


def isolated_round(argv: list[str], first: int, count: int, cases: list[str], poisson_rate: Optional[float],
                   out: Path) -> dict:
    """Round `first` (0-based) of `count` runs, each in a child process; the merged results, as `run` returns.
    `cases` are the run's, gemm among them where asked: a child leaves gemm out past the first round itself, as one
    process does (a `--commitment gemm=FILE` then still names one of its cases)."""
    merged: Optional[dict] = None
    for only in range(count):
        folder = out / "isolated" / f"round{first + 1}_run{only + 1}"
        cmd = child_command(argv, first, only, cases, poisson_rate, folder)
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"--isolate: run {only + 1} of {count} in round {first + 1} exited with "
                               f"{done.returncode}: {' '.join(cmd)}")
        child = json.loads((folder / "bench.json").read_text())
        if poisson_rate is None and "poisson_rate_per_s" in child:
            poisson_rate = child["poisson_rate_per_s"]  # stock's offline rate sets every later run's arrivals
        merged = child if merged is None else merge_run(merged, child)
    assert merged is not None, "a round has at least stock's run"
    return merged
