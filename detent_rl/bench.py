"""`python -m detent_rl.bench`: the rollout arms side by side in one run, on the same weights and prompts.

Each arm — stock (cuBLAS linears, CUDA-graph decode with the selection fixed at capture: what a fast
non-invariant engine does), detent (the default tuple), tuned (detent with --commitment FILE, a tuple
from `python -m detent_rl.tune`), det (one
conservative configuration per op) and corun (stock's kernels held still by fixed shapes: prefill
alone, decode padded to the maximum concurrency) — loads the same checkpoint and runs the same cases; every ratio
is an arm's time over stock's in this run. Cases:

- `decode-1`, `decode-32`: batch 1 and 32, 128-token prompts, greedy; ms per decode step: the
  steps after every request's first token, timed alone (the prefill left out). Batch 1 also gives the % of the HBM
  roofline: the weights' bytes over the copy bandwidth measured in this run, over the step.
- `poisson`: a seeded trace of requests (prompts 64-512 tokens, outputs 32-256, T = 1) arriving as a
  Poisson process at `--load` x stock's offline rate (the trace run all at once, as the paper sets its
  loads); a request's latency per output token = (finish - arrival) / its output tokens: p50/p90/p99. The
  engine warms up first (`Engine.warmup`), then serves the trace `--serves` times (5); the result is the serve with
  the median p50, and the Triton variants compiled inside the timed serves are reported.
- `grpo`: the GRPO-shaped batch, 32 prompts x 8 samples, 200-token prompts, 256 new tokens, T = 1:
  output tokens per second; and its phases: the time until every sequence has its first token (the
  prefill), then ms per decode step.
- `long`: batch 2, 12,000-token prompts: ms per decode step.
- `gemm` (CUDA only): every linear site of the model against cuBLAS at M = 1 ... 8,192, CUDA-graph
  replays over rotating weight copies (read from HBM, as in a step, not from L2): the detent
  default's and det's ratios, our kernel alone (its PDL off, as cuBLAS runs) and with PDL on.

    python -m detent_rl.bench --model qwen2-0.5b --out runs/bench_05b
    python -m detent_rl.bench --model qwen2-1.5b --cases decode-1,decode-32,long --out runs/bench_15b

A tuned tuple is made for a deployment and a workload: `--commitment CASE=FILE,...` gives each case its own
(the batch-1 tuple for decode-1, the GRPO tuple for grpo, ...: every goal in one run), one model a file; a
case it does not name has no tuned run. A case's deployment is the same in every arm: the serving cases share
one context limit (their longest request), `long` has its own, and `--max-num-tokens 8192,long=16384` gives a
case its own limit on tokens per forward. Every tuple is checked against its case's limits before any arm runs.

    python -m detent_rl.bench --cases decode-1,decode-32,grpo,long --arms stock,detent,tuned,det --rounds 3 \
        --max-num-tokens 8192,long=16384 --out runs/b --commitment decode-1=bench/tuned/h200_qwen2-0.5b_decode1.json,\
    grpo=bench/tuned/h200_qwen2-0.5b_grpo32x8.json,long=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json

The stock arm runs with our kernels' programmatic dependent launch on and off (`--stock-pdl`; its
linears are cuBLAS's either way) and keeps the faster run per case (on a CUDA device: elsewhere once).

`--rounds R` runs the arms R times in turn, each round starting at the next arm (the
first at stock) and serving the first round's Poisson arrivals; each ratio is then the median of the
rounds' paired ratios (an arm over the same round's stock run), which a drift of the machine between
rounds does not bias (`detent_rl/bench_report.py`). On a CUDA device each arm's run goes in a process of its own
(`--isolate auto`, the default; `on` anywhere, `off` to keep every run in this process; `detent_rl/bench_isolate.py`),
as a deployment runs one engine a process: no run meets what another left. In one process on an H100, stock's batch-1
step took ~10 % longer and the tuned arm's ~2 % after other runs (docs/BENCHMARKS.md, session 59).

`--step-graphs whole` (the default on a CUDA device, as `rollout.step_graphs` is: `auto`) runs every arm's prefill
and mixed steps through whole-step CUDA graphs (`rollout/full_steps.py`: attention inside, one graph a padded size;
the stock arm too, as a stock engine's full graphs), and `on` through piecewise graphs with attention eager between
them (`rollout/step_graphs.py`, as vLLM V1 does); `--step-graphs off,on` runs each arm both ways on the same model
load, the graphed runs as `<arm> + pieces` over stock's graphed run (the same engine features on both sides), and
adds a table of each arm's time with the pieces over without (the rounds' paired ratios): the pieces' A/B in one
run; `on,whole` runs each arm both ways, the whole-step runs as `<arm> + whole` over stock's, with a table of each
arm's time through them over its time through the pieces; `off,whole` the same against no step graphs at all (what the
default costs or saves a case, decode steps included, in one process).

    python -m detent_rl.bench --arms stock,tuned --cases poisson,grpo --step-graphs off,on --rounds 3 \
        --commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json --out runs/pieces

`--gated-mlp on` runs the pinned arms' SiLU-and-mul in the gate/up projection's epilogue (`DETENT_GATED_MLP=1`,
`kernels/matmul_gated.py`: the same bits, one launch a layer less); `off,on` runs them both ways, as `<arm> + gated`
over the plain stock run (stock never takes it), with a table of each arm's time with it over without.

The cases themselves are `detent_rl/bench_cases.py`'s. Writes `bench.md` (the tables), `bench.json` and
`bench.png` (time over stock per case) to --out.
`--quick` shrinks every case (a smoke test, e.g. on the CPU with `--model tiny`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from detent_rl.bench_cases import QUICK, Bench, Shapes, copy_bandwidth, poisson_arrivals, trace_of, weight_bytes
from detent_rl.bench_args import per_case_tokens, per_case_tuples
from detent_rl.bench_isolate import isolated_round
from detent_rl.bench_report import merge_rounds, plot, render, time_vs_stock, variant
from detent_rl.cli_checks import model_on_device
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models.model import CausalLM

ARMS = ("stock", "detent", "det", "corun")
CASES = ("decode-1", "decode-32", "poisson", "grpo", "long", "gemm")


def case_limits(cases: list[str], shapes: Shapes, max_num_tokens: dict[str, int]) -> dict[str, dict[str, int]]:
    """Each case's deployment, the same in every arm: the serving cases share one context limit (their
    longest request), `long` has its own (its 12,000-token prompts), so a tuple made for the short cases'
    deployment (a batch-1 or GRPO tuple) and one made for the long case's run in the same bench run.
    `max_num_tokens` maps a case (or "" for every other) to its limit on tokens per forward."""
    short = max(shapes.decode_prompt + shapes.decode_new, shapes.poisson_prompt[1] + shapes.poisson_new[1],
                shapes.grpo[2] + shapes.grpo[3])
    return {c: dict(max_context=max(short, shapes.long[1] + shapes.long[2] if c == "long" else 0) + 16,
                    max_batch=max(64, shapes.grpo[0] * shapes.grpo[1]),
                    max_num_tokens=max_num_tokens.get(c, max_num_tokens[""])) for c in cases}


def deployment(arm: str, case: str, shapes: Shapes, limits: dict[str, dict[str, int]]) -> dict[str, int]:
    """The deployment `arm` runs `case` on: the case's limits (`case_limits`), but for CoRun with max_batch set to
    the case's engine's sequences in flight. CoRun pads every decode step to the deployment's maximum concurrency
    (`Engine`), which a CoRun server sets to the concurrency it serves: the shared max_batch (256, for the GRPO
    batch) would pad a batch-1, a 32-request, a 64-slot online and a 2-request long decode to 256 rows, a cost its
    users would not pay (the bench did so until session 38)."""
    slots = shapes.slots(case)
    if arm != "corun" or slots is None:
        return limits[case]
    return {**limits[case], "max_batch": min(slots, limits[case]["max_batch"])}


def planned_runs(arms: tuple[str, ...], cases: list[str], shapes: Shapes, stock_pdl: tuple[str, ...],
                 tuned: Optional[dict[str, str]], limits: dict[str, dict[str, int]], first: int = 0) -> list[tuple]:
    """A round's runs in order, from the `first`-th: (arm, PDL setting, its cases, tuple file or None, deployment),
    one model load each."""
    def groups(arm: str, arm_cases: list[str]) -> list[tuple[list[str], dict[str, int]]]:
        """The arm's cases by deployment, in their order."""
        key = {c: tuple(sorted(deployment(arm, c, shapes, limits).items())) for c in arm_cases}
        return [([c for c in arm_cases if key[c] == k], dict(k)) for k in dict.fromkeys(key.values())]
    runs: list[tuple[str, str, list[str], Optional[str], dict[str, int]]] = []
    for arm in arms:
        if arm == "tuned":
            files = list(dict.fromkeys((tuned or {})[c] for c in cases if c in (tuned or {})))
            runs += [(arm, "on", group, f, lim) for f in files
                     for group, lim in groups(arm, [c for c in cases if (tuned or {}).get(c) == f])]
        else:
            runs += [(arm, pdl, group, None, lim) for pdl in (stock_pdl if arm == "stock" else ("on",))
                     for group, lim in groups(arm, cases)]
    return runs[first % len(runs):] + runs[:first % len(runs)]


def run(load: Callable[..., CausalLM], cases: list[str], shapes: Shapes, load_factor: float,
        log: Callable[[str], None] = print, arms: tuple[str, ...] = ARMS,
        stock_pdl: tuple[str, ...] = ("on", "off"), tuned: Optional[dict[str, str]] = None, *,
        limits: dict[str, dict[str, int]], first: int = 0, poisson_rate: Optional[float] = None,
        step_graphs: tuple[bool | str, ...] = (False,), gated_mlp: tuple[bool, ...] = (False,), kernels: bool = False,
        only: Optional[int] = None) -> dict:
    """Every case in every arm; the results by case and arm.

    The stock arm runs once per `stock_pdl` setting of our kernels' programmatic dependent launch
    (`kernels._triton.pdl`; its linears are cuBLAS's either way) and keeps, per case, the faster run:
    the baseline is the best stock configuration, not ours. The other arms run with PDL on (the
    default). Each stock run's result stays in `results["stock_runs"]`. `tuned` maps a case to the
    tuple file the arm `tuned` runs it with, one model a file; a case it does not map has no tuned run.
    `limits` maps a case to its deployment (`case_limits`): an arm loads one model per distinct
    deployment of its cases (`load(arm, file, limits)`; CoRun's max_batch is each case's concurrency: `deployment`).

    The runs go in arm order from the `first`-th (stock's first: 0), so that rounds can each start at
    another arm: whatever a process's first run of a kernel meets (a compile, a cold cache) is not always
    the same arm's (`planned_runs`); `only` makes the one run of that index (`--isolate`: each run in a process of
    its own, bench_isolate.py). The Poisson trace's arrival rate is `poisson_rate`, else `load_factor` x stock's
    offline rate, which then needs stock to run first. `step_graphs`: whether every arm's engines run prefill
    and mixed steps through piecewise graphs (`rollout/step_graphs.py`), as vLLM V1 does; (False, True) runs
    each arm both ways on the same model load, the graphed runs as arm `<arm> + pieces`, each against its own
    kind of stock run (`bench_report.baseline`); "whole": through whole-step graphs (`rollout/full_steps.py`),
    and (True, "whole") runs each arm through the pieces and as `<arm> + whole`, (False, "whole") without step
    graphs and as `<arm> + whole`. `gated_mlp`: whether the runs
    set DETENT_GATED_MLP=1 (the pinned arms' SiLU-and-mul in the gate/up projection's epilogue,
    `kernels/matmul_gated.py`); (False, True) runs the pinned arms both ways too, as `<arm> + gated` (over the
    plain stock run: stock never takes it). The gemm case runs once, plain. DETENT_PDL and DETENT_GATED_MLP are
    set for each run and put back as they were after. `kernels`: the Poisson case also reports each arm's time by
    kernel over one more serve (`Bench`)."""
    variants = [(p, g) for p in step_graphs for g in gated_mlp]
    both_p, both_g = len(step_graphs) > 1, len(gated_mlp) > 1

    def name_of(arm: str, pieces: bool | str, gated: bool) -> Optional[str]:
        """The run's arm name; None for a run not made (stock's gated twin: the same run as its plain one). The
        first of `step_graphs` is the plain run; the other is flagged `pieces` or `whole`."""
        if arm == "stock" and gated and both_g:
            return None
        flag = [] if not both_p or pieces == step_graphs[0] else ["whole" if pieces == "whole" else "pieces"]
        return variant(arm, *flag, *(["gated"] if gated and both_g else []))
    names = [n for arm in arms for p, g in variants if (n := name_of(arm, p, g)) is not None]
    results: dict[str, Any] = {"cases": {c: {} for c in cases}, "arms": names, "stock_runs": {},
                               "step_graphs": step_graphs[0] if not both_p else
                               {(False, True): "both", (False, "whole"): "off,whole",
                                (True, "whole"): "pieces,whole"}[step_graphs],
                               "gated_mlp": gated_mlp[0] if not both_g else "both"}
    saved = {k: os.environ.get(k) for k in ("DETENT_PDL", "DETENT_GATED_MLP")}
    arrivals = None if poisson_rate is None else poisson_arrivals(shapes.poisson_requests, poisson_rate)
    if poisson_rate is not None:
        results["poisson_rate_per_s"] = poisson_rate

    runs = planned_runs(arms, cases, shapes, stock_pdl, tuned, limits, first)
    if only is not None:  # one run of the round, in a process of its own (`--isolate`)
        runs = [runs[only]]
    for arm, pdl, arm_cases, file, lim in runs:
        os.environ["DETENT_PDL"] = "1" if pdl == "on" else "0"  # read at each launch (and graph capture)
        model = load(arm, file, lim)
        if "device" not in results:  # (the same weights in every arm)
            results["device"] = torch.cuda.get_device_name() if model.device.type == "cuda" else "cpu"
            nbytes = 1 << 30 if model.device.type == "cuda" else 1 << 27
            results["copy_bandwidth_gbs"] = copy_bandwidth(model.device, nbytes) / 1e9
            results["weight_bytes"] = weight_bytes(model)
        for (pieces, gated), case in [(v, c) for v in variants for c in arm_cases]:
            name = name_of(arm, pieces, gated)
            if name is None or (case == "gemm" and name != arm):
                continue
            os.environ["DETENT_GATED_MLP"] = "1" if gated else "0"  # read at each MLP call (and graph capture)
            b = Bench(model, shapes, pieces, kernels)
            log(f"{name}, PDL {pdl}: {case}" + (f" ({file})" if file is not None else ""))
            if case == "decode-1":
                r = b.decode(1, shapes.decode_prompt, shapes.decode_new)
                roofline_ms = 1e3 * results["weight_bytes"] / (results["copy_bandwidth_gbs"] * 1e9)
                r["roofline_pct"] = 100 * roofline_ms / r["ms_per_step"] if r["ms_per_step"] > 0 else float("nan")
            elif case == "decode-32":
                r = b.decode(min(32, model.selections.deployment.max_batch), shapes.decode_prompt, shapes.decode_new)
            elif case == "poisson":
                trace = trace_of(shapes, b.vocab)
                if arrivals is None:  # the load is set by stock's offline rate
                    assert arm == "stock", "the Poisson rate is stock's: give poisson_rate or run stock first"
                    rate = load_factor * len(trace) / b.offline(trace)
                    arrivals = poisson_arrivals(len(trace), rate)
                    results["poisson_rate_per_s"] = rate
                r = b.poisson(arrivals, trace)
            elif case == "grpo":
                r = b.grpo(*shapes.grpo)
            elif case == "long":
                batch, prompt, new = shapes.long
                r = b.decode(batch, prompt, new)
            elif case == "gemm":
                if model.device.type != "cuda" or arm == "stock":
                    continue
                r = {"sites": b.gemm()}
            r["pdl"], r["pid"] = pdl, os.getpid()
            r["max_batch"] = model.selections.deployment.max_batch
            if file is not None:
                r["commitment"] = str(file)
            if arm == "stock":
                r["pieces"] = pieces
                results["stock_runs"].setdefault(case, []).append(r)
                held = results["cases"][case].get(name)
                if held is not None and time_vs_stock(case, r, held) >= 1.0:
                    continue  # the faster stock run stays the baseline
            results["cases"][case][name] = r
            del b
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return results


def isolating(setting: str, device: str) -> bool:
    """Whether `--isolate SETTING` runs each run of a round in a process of its own on `device`: auto on CUDA."""
    return setting == "on" or (setting == "auto" and device.startswith("cuda"))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", help="a built-in name or an HF checkpoint directory")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--commitment", help="a tuned tuple (python -m detent_rl.tune): adds the arm `tuned`, detent "
                                         "with this tuple beside detent with the default one; or CASE=FILE,... "
                                         "(each case with its deployment's tuple, e.g. decode-1=D1.json,grpo=T.json; "
                                         "a case not named has no tuned run)")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated, of {', '.join(ARMS + ('tuned',))} (stock always runs; tuned needs "
                         f"--commitment)")
    ap.add_argument("--stock-pdl", default="auto",
                    help="the stock arm runs once per setting of our kernels' PDL (on, off) and keeps its faster run "
                         "(auto: on,off on a CUDA device; elsewhere on, where there is no PDL to set)")
    ap.add_argument("--load", type=float, default=0.5, help="poisson: arrival rate as a share of stock's offline rate")
    ap.add_argument("--poisson-rate", type=float,
                    help="poisson: this arrival rate (requests/s) instead of --load x stock's offline rate (which a "
                         "stock serve's stall would lower for every arm): runs at one rate compare across runs")
    ap.add_argument("--serves", type=int, help="poisson: serves of the trace a round, after one warm-up; an arm's "
                    "result is its median-p50 serve (default 5; --quick 1)")
    ap.add_argument("--max-num-tokens", default="8192",
                    help="every arm's deployment limit on tokens per forward (a tuned tuple names its own: match it): "
                         "N, or N,CASE=N,... for a case with its own (e.g. 8192,long=16384)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the arms this many times in turn, each round loading them afresh; a ratio is then "
                         "the median of the rounds' paired ratios (gemm runs in the first round only)")
    ap.add_argument("--step-graphs", default="auto", choices=("auto", "on", "off", "whole", "off,on", "on,whole",
                                                                 "off,whole"),
                    metavar="{auto,on,off,whole,'off,on','on,whole','off,whole'}",
                    help="every arm runs its prefill and mixed steps through whole-step CUDA graphs, attention "
                         "inside (whole, rollout/full_steps.py; auto: whole on a CUDA device, as a run's "
                         "rollout.step_graphs) or piecewise graphs (on, rollout/step_graphs.py); off,on: each arm "
                         "both ways in the same run, the graphed runs as '<arm> + pieces' against stock's graphed "
                         "run; on,whole: each arm through the pieces and through whole-step graphs ('<arm> + whole'); "
                         "off,whole: without step graphs and through whole-step graphs")
    ap.add_argument("--gated-mlp", default="off", choices=("on", "off", "off,on"), metavar="{on,off,'off,on'}",
                    help="the pinned arms run SiLU-and-mul in the gate/up projection's epilogue (DETENT_GATED_MLP=1, "
                         "kernels/matmul_gated.py); off,on: both ways in the same run, as '<arm> + gated'")
    ap.add_argument("--kernels", action="store_true", help="poisson: serve the trace once more under the torch "
                    "profiler and report each arm's device time by kernel (on the CPU: by operator)")
    ap.add_argument("--isolate", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                    help="each run of a round (an arm's model load and its cases) in a process of its own, as a "
                         "deployment runs one engine a process (detent_rl/bench_isolate.py); the rounds alternate. "
                         "auto (the default): on a CUDA device; a bare --isolate: on")
    ap.add_argument("--first", type=int, help=argparse.SUPPRESS)  # (an isolated run's round: bench_isolate.py)
    ap.add_argument("--only", type=int, help=argparse.SUPPRESS)  # (an isolated run's index in its round)
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    ap.add_argument("--out", required=True, help="folder for bench.md, bench.json, bench.png")
    args = ap.parse_args(argv)
    if args.poisson_rate is not None and not (math.isfinite(args.poisson_rate) and args.poisson_rate > 0):
        ap.error(f"--poisson-rate: expected a positive number of requests/s, got {args.poisson_rate}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    asked = [a.strip() for a in args.arms.split(",") if a.strip()]
    known = ARMS + ("tuned",)
    if [a for a in asked if a not in known]:
        ap.error(f"--arms: unknown {[a for a in asked if a not in known]}; known: {', '.join(known)}")
    if "tuned" in asked and not args.commitment:
        ap.error("--arms tuned: give its tuple with --commitment")
    if args.commitment and "tuned" not in asked:
        asked.append("tuned")
    arms = ("stock",) + tuple(a for a in known if a != "stock" and a in asked)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: give 1 or more")
    if not 0 < args.load <= 1.5:
        ap.error(f"--load {args.load}: give a share of stock's offline rate in (0, 1.5]")
    pdl_setting = ("on,off" if args.device.startswith("cuda") else "on") if args.stock_pdl == "auto" else args.stock_pdl
    stock_pdl = tuple(p.strip() for p in pdl_setting.split(",") if p.strip())
    if not stock_pdl or [p for p in stock_pdl if p not in ("on", "off")]:
        ap.error(f"--stock-pdl {args.stock_pdl!r}: give on, off, on,off or auto")
    shapes = QUICK if args.quick else Shapes()
    if args.serves is not None:
        if args.serves < 1:
            ap.error(f"--serves {args.serves}: give 1 or more")
        shapes = dataclasses.replace(shapes, poisson_serves=args.serves)
    from detent_rl.models import load_model
    try:
        path = model_on_device(args.model, args.device)
    except ValueError as e:
        ap.error(str(e))
    limits = case_limits(cases, shapes, per_case_tokens(args.max_num_tokens, cases, ap.error))
    tuned = per_case_tuples(args.commitment, cases, ap.error) if args.commitment else {}
    tuples: dict[str, CommitmentTuple] = {}
    for case, f in tuned.items():  # each refused now, with the loader's reason, before any arm runs
        try:
            tuples[f] = tuples.get(f) or CommitmentTuple.load(f)
            load_model(path, "detent", device="meta", dtype=getattr(torch, args.dtype), commitment=tuples[f],
                       **limits[case])
        except Exception as e:  # noqa: BLE001 (any refusal of the tuple: its message names it)
            ap.error(f"--commitment {f}: {e} (the {case} case's limits: {limits[case]})")

    def load(arm: str, file: Optional[str], lim: dict[str, int]) -> CausalLM:
        return load_model(path, "detent" if arm == "tuned" else arm, device=args.device,
                          dtype=getattr(torch, args.dtype), commitment=tuples[file] if file else None, **lim)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    graphs = ("whole" if args.device.startswith("cuda") else "off") if args.step_graphs == "auto" else \
        args.step_graphs
    pieces = tuple("whole" if x == "whole" else x == "on" for x in graphs.split(","))
    isolate = isolating(args.isolate, args.device)
    done: list[dict] = []
    for i in range(args.rounds):  # the files are written after every round: a run cut short keeps what it finished
        first = i if args.first is None else args.first
        round_cases = cases if first == 0 else [c for c in cases if c != "gemm"]
        rate = done[0].get("poisson_rate_per_s") if done else args.poisson_rate
        if isolate and args.only is None:
            count = len(planned_runs(arms, round_cases, shapes, stock_pdl, tuned, limits, first))
            done.append(isolated_round(sys.argv[1:] if argv is None else argv, first, count, cases, rate, out))
        else:
            done.append(run(load, round_cases, shapes, args.load, arms=arms, stock_pdl=stock_pdl, tuned=tuned,
                            limits=limits, first=first, poisson_rate=rate, step_graphs=pieces,
                            gated_mlp=tuple(x == "on" for x in args.gated_mlp.split(",")), kernels=args.kernels,
                            only=args.only))
        results = merge_rounds(done)
        results.update(model=args.model, dtype=args.dtype, limits=limits, quick=args.quick, rounds_asked=args.rounds,
                       isolated=isolate or args.only is not None,
                       commitment={c: {"file": f, "sha256": tuples[f].sha256()} for c, f in tuned.items()} or None)
        text = render(results)
        (out / "bench.md").write_text(text + "\n")
        (out / "bench.json").write_text(json.dumps(results, indent=1, default=str))
        plot(results, out / "bench.png")
    print(text)
    print(f"wrote {out / 'bench.md'}, bench.json, bench.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
