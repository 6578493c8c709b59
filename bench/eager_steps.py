"""Eager engine steps' wall time, stock vs tuned, in alternating rounds in one process (online serving's prefill
and mixed steps are not graph replays: their host time is the step's).

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/eager_steps.py [--model qwen2-0.5b]
        [--commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json] [--rounds 5] [--steps 10]
        [--linear-from OLD_MATMUL.py] [--step-graphs] [--pieces-only] [--shapes mixed,serve] [--kernels 8]

Each arm's engine is warmed up (`Engine.warmup`: nothing compiles in a timed step), then four steps are
timed, each `--steps` times synced: a mixed step (47 decode rows beside a 256-token prefill chunk), a 4 x 256
prefill, 48 rows of one or two tokens run eagerly, and the GRPO batch's prefill step (32 prompts of 200 tokens,
and 224 samples of them whose 192 cached tokens leave 8 each: 8,192 tokens). Prints each arm's median ms a step,
its ratio to stock and the rounds' range. `--step-graphs` adds each arm's engine with piecewise step graphs
(`rollout/step_graphs.py`, captured in its warm-up) beside the plain one: `stock + pieces`, `tuned + pieces`;
`--whole` each arm's engine with whole-step graphs (`rollout/full_steps.py`: attention inside, one graph a padded
size), `stock + whole`, `tuned + whole`.
`--pieces-only` times only the engines with pieces. `--shapes` picks shapes by their first word (`mixed`, `serve`:
40 decode rows beside two 288-token chunks, as the Poisson case's eager steps, `prefill`, `eager`, `grpo`).
`--kernels N` then profiles each arm's steps of each shape once more (torch profiler) and prints its device's busy
time a step and its N costliest kernels by exclusive time (`detent_rl/kernel_times.py`: a PDL wait counted once):
what of a step's wall is the GPU's and which kernels differ between the arms. `--host-top N` prints each arm's N
costliest host functions by own time over the steps of each shape (cProfile; a function's wait for the device counts
as its own: the sampled tokens' read holds the GPU's time). `--phases` times named functions of each arm's steps by
real time instead (`detent_rl/host_phases.py`: inclusive host µs a step and a call; cProfile inflates Python-heavy
calls several times): the step, its inputs, the pieces' replays, the attention between them and its launches, the
LM head and the sampler. `--linear-from FILE` adds the arm `tuned (FILE)`: the
same engine with `linear` taken from another version of kernels/matmul.py (`git show 4d595e0:kernels/matmul.py >
old.py`: before session 33's routes), an A/B of the linear's host path in one process. On the CPU it runs too (slowly:
use `--model tiny --commitment ''`: the default tuple, arm `detent`), without warm-up or warpgroup kernels."""
from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import pstats
import statistics
import time

import torch

from detent_rl.host_phases import host_phases
from detent_rl.kernels import autograd
from detent_rl.kernel_times import kernel_times
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.warmup import synthetic_spans
from detent_rl.timing import sync

# (cached, new) tokens of each sequence
SHAPES = {"mixed 47 x 1 + 256": [(300, 1)] * 47 + [(0, 256)],
          "serve 40 x 1 + 2 x 288": [(400, 1)] * 40 + [(0, 288)] * 2, "prefill 4 x 256": [(0, 256)] * 4,
          "eager 48 rows": [(300, 1)] * 47 + [(0, 2)],
          "grpo prefill 32 x 200 + 224 x 8": [(0, 200)] * 32 + [(192, 8)] * 224}
# the functions `--phases` times (the bindings the engine's step calls through)
PHASES = ["detent_rl.rollout.engine:Engine._step", "detent_rl.rollout.engine:step_inputs",
          "detent_rl.models.runner:attn_meta", "detent_rl.kernels.attention:device_tensor",
          "detent_rl.models.runner:device_tensor", "detent_rl.models.model:CausalLM.select_attention", "torch:tensor",
          "torch:Tensor.to", "detent_rl.rollout.full_steps:FullStepGraphs._stage",
          "detent_rl.rollout.full_steps:FullStepGraphs.run", "detent_rl.rollout.full_steps:FullStepGraphs.takes",
          "detent_rl.rollout.step_graphs:StepGraphs.forward", "torch.cuda:CUDAGraph.replay",
          "detent_rl.models.layers:Attention.attend", "detent_rl.models.layers:attention_autograd",
          "detent_rl.kernels.autograd:paged_attention", "detent_rl.kernels.attention:_check",
          "detent_rl.kernels.attention:launch", "detent_rl.kernels.attention:plan_for",
          "detent_rl.kernels.attention_plan:_Plan.replay", "detent_rl.kernels.attention_plan:_Plan.record",
          "detent_rl.kernels.attention_combine:launch", "detent_rl.models.model:CausalLM.logits",
          "detent_rl.rollout.engine:sample", "torch:Tensor.tolist"]  # (the last: the sampled tokens' wait)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--commitment", default="bench/tuned/h200_qwen2-0.5b_grpo32x8.json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--linear-from", default=None)
    ap.add_argument("--step-graphs", action="store_true")
    ap.add_argument("--pieces-only", action="store_true", help="only the engines with pieces (implies --step-graphs)")
    ap.add_argument("--whole", action="store_true", help="add each arm's engine with whole-step graphs (attention "
                    "inside: rollout/full_steps.py), '<arm> + whole'")
    ap.add_argument("--shapes", default="", help="comma-separated first words of the shapes to run (default: all)")
    ap.add_argument("--kernels", type=int, default=0, help="profile each arm's steps: device time, top N kernels")
    ap.add_argument("--host-top", type=int, default=0, help="each arm's N costliest host functions (cProfile)")
    ap.add_argument("--phases", action="store_true", help="each arm's host µs in named functions (real time)")
    args = ap.parse_args()
    args.step_graphs = args.step_graphs or args.pieces_only
    wanted = [w for w in args.shapes.split(",") if w]
    unknown = sorted(set(wanted) - {name.split()[0] for name in SHAPES})
    if unknown:
        ap.error(f"--shapes: unknown {unknown} (the shapes' first words: {sorted({n.split()[0] for n in SHAPES})})")
    shapes = {name: shape for name, shape in SHAPES.items() if not wanted or name.split()[0] in wanted}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = builtin_checkpoint(args.model)
    engines = {}
    pinned = "tuned" if args.commitment else "detent"  # (--commitment '': the default tuple)
    for arm, commitment in (("stock", None), (pinned, CommitmentTuple.load(args.commitment) if args.commitment
                                              else None)):
        model = load_model(path, "stock" if arm == "stock" else "detent", device=device, dtype=dtype,
                           commitment=commitment, max_context=784, max_batch=256, max_num_tokens=8192)
        if not args.pieces_only:
            engines[arm] = Engine.for_requests(model, 256, 784, 256)
        if args.step_graphs:
            engines[f"{arm} + pieces"] = Engine.for_requests(model, 256, 784, 256, step_graphs=True)
        if args.whole:
            engines[f"{arm} + whole"] = Engine.for_requests(model, 256, 784, 256, full_steps=True)
    for engine in engines.values():
        if device == "cuda":
            engine.warmup()
    ours = autograd.linear  # what the layers' no-grad linears call
    arms = [] if args.pieces_only else [("stock", "stock", None), (pinned, pinned, ours)]
    if args.step_graphs:
        arms += [(f"{a} + pieces", f"{a} + pieces", None if a == "stock" else ours) for a in ("stock", pinned)]
    if args.whole:
        arms += [(f"{a} + whole", f"{a} + whole", None if a == "stock" else ours) for a in ("stock", pinned)]
    if args.linear_from:
        if args.pieces_only:
            ap.error("--linear-from times the plain engine: not with --pieces-only")
        spec = importlib.util.spec_from_file_location("linear_from", args.linear_from)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        arms.insert(1, (f"{pinned} ({args.linear_from})", pinned, other.linear))
    times: dict = {(label, s): [] for label, _, _ in arms for s in shapes}
    profiles: dict = {}
    try:
        for _ in range(args.rounds):
            for label, name, engine, spans in _each(arms, shapes, engines):
                for _ in range(2):
                    engine._step(spans)
                sync(torch.device(device))
                gc.collect()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    engine._step(spans)
                sync(torch.device(device))
                times[(label, name)].append((time.perf_counter() - t0) / args.steps * 1e3)
        for label, name, engine, spans in _each(arms, shapes, engines) if args.kernels else ():
            profiles[(label, name)] = kernel_times(lambda: [engine._step(spans) for _ in range(args.steps)],
                                                   torch.device(device))
        for label, name, engine, spans in _each(arms, shapes, engines) if args.host_top else ():
            with cProfile.Profile() as host:
                for _ in range(args.steps):
                    engine._step(spans)
                sync(torch.device(device))
            print(f"{args.model} {name}, {label}: the host's costliest functions over {args.steps} steps")
            pstats.Stats(host).sort_stats("tottime").print_stats(args.host_top)
        for label, name, engine, spans in _each(arms, shapes, engines) if args.phases else ():
            sync(torch.device(device))
            with host_phases(PHASES) as phases:
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    engine._step(spans)
                sync(torch.device(device))
                wall = (time.perf_counter() - t0) / args.steps * 1e6
            print(f"{args.model} {name}, {label}: host µs in named functions, {wall:.0f} µs a step of wall "
                  f"(timed)\n{phases.table(args.steps)}", flush=True)
    finally:
        autograd.linear = ours
    base_label = arms[0][0]
    for name in shapes:
        base = statistics.median(times[(base_label, name)])
        cells = [f"{label} {statistics.median(ts):.2f} ms ({statistics.median(ts) / base:.2f}x; "
                 f"{min(ts):.2f}-{max(ts):.2f})" for label, _, _ in arms for ts in [times[(label, name)]]]
        print(f"{args.model} {name}: " + ", ".join(cells), flush=True)
    for (label, name), per in profiles.items():
        total = sum(us for _, us in per.values()) / args.steps
        top = ", ".join(f"{k} {us / args.steps:.0f} µs ({n / args.steps:g} launches)" for k, (n, us) in
                        list(per.items())[:args.kernels])
        print(f"{args.model} {name}, {label}: device busy {total / 1e3:.2f} ms a step; {top}", flush=True)


def _each(arms: list, shapes: dict, engines: dict):
    """(label, shape name, engine, its spans) of every arm and shape in turn, the arm's linear put in place first."""
    for label, arm, linear in arms:
        if linear is not None:
            autograd.linear = linear
        for name, shape in shapes.items():
            yield label, name, engines[arm], _spans(engines[arm], shape)


def _spans(engine: Engine, shape: list[tuple[int, int]]):
    pages = -(-max(c + n for c, n in shape) // engine.model.page_size)
    return synthetic_spans(engine, [n for _, n in shape], [c for c, _ in shape], pages)


if __name__ == "__main__":
    main()
