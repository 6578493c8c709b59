"""Eager engine steps' wall time, stock vs tuned, in alternating rounds in one process (online serving's prefill
and mixed steps are not graph replays: their host time is the step's).

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/eager_steps.py [--model qwen2-0.5b]
        [--commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json] [--rounds 5] [--steps 10]
        [--linear-from OLD_MATMUL.py] [--step-graphs]

Each arm's engine is warmed up (`Engine.warmup`: nothing compiles in a timed step), then four steps are
timed, each `--steps` times synced: a mixed step (47 decode rows beside a 256-token prefill chunk), a 4 x 256
prefill, 48 rows of one or two tokens run eagerly, and the GRPO batch's prefill step (32 prompts of 200 tokens,
and 224 samples of them whose 192 cached tokens leave 8 each: 8,192 tokens). Prints each arm's median ms a step,
its ratio to stock and the rounds' range. `--step-graphs` adds each arm's engine with piecewise step graphs
(`rollout/step_graphs.py`, captured in its warm-up) beside the plain one: `stock + pieces`, `tuned + pieces`.
`--linear-from FILE` adds the arm `tuned (FILE)`: the same engine with `linear` taken from another version of
kernels/matmul.py (`git show 4d595e0:kernels/matmul.py > old.py`: before session 33's routes), an A/B of the
linear's host path in one process. On the CPU it runs too (slowly: use
`--model tiny --commitment ''`: the default tuple, arm `detent`), without warm-up or warpgroup kernels."""
from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time

import torch

from detent_rl.kernels import autograd
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.warmup import synthetic_spans
from detent_rl.timing import sync

# (cached, new) tokens of each sequence
SHAPES = {"mixed 47 x 1 + 256": [(300, 1)] * 47 + [(0, 256)], "prefill 4 x 256": [(0, 256)] * 4,
          "eager 48 rows": [(300, 1)] * 47 + [(0, 2)],
          "grpo prefill 32 x 200 + 224 x 8": [(0, 200)] * 32 + [(192, 8)] * 224}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--commitment", default="bench/tuned/h200_qwen2-0.5b_grpo32x8.json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--linear-from", default=None)
    ap.add_argument("--step-graphs", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = builtin_checkpoint(args.model)
    engines = {}
    pinned = "tuned" if args.commitment else "detent"  # (--commitment '': the default tuple)
    for arm, commitment in (("stock", None), (pinned, CommitmentTuple.load(args.commitment) if args.commitment
                                              else None)):
        model = load_model(path, "stock" if arm == "stock" else "detent", device=device, dtype=dtype,
                           commitment=commitment, max_context=784, max_batch=256, max_num_tokens=8192)
        engines[arm] = Engine.for_requests(model, 256, 784, 256)
        if args.step_graphs:
            engines[f"{arm} + pieces"] = Engine.for_requests(model, 256, 784, 256, step_graphs=True)
    for engine in engines.values():
        if device == "cuda":
            engine.warmup()
    ours = autograd.linear  # what the layers' no-grad linears call
    arms = [("stock", "stock", None), (pinned, pinned, ours)]
    if args.step_graphs:
        arms += [(f"{a} + pieces", f"{a} + pieces", None if a == "stock" else ours) for a in ("stock", pinned)]
    if args.linear_from:
        spec = importlib.util.spec_from_file_location("linear_from", args.linear_from)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        arms.insert(1, (f"{pinned} ({args.linear_from})", pinned, other.linear))
    times: dict = {(label, s): [] for label, _, _ in arms for s in SHAPES}
    try:
        for _ in range(args.rounds):
            for label, arm, linear in arms:
                if linear is not None:
                    autograd.linear = linear
                for name, shape in SHAPES.items():
                    pages = -(-max(c + n for c, n in shape) // engines[arm].model.page_size)
                    spans = synthetic_spans(engines[arm], [n for _, n in shape], [c for c, _ in shape], pages)
                    for _ in range(2):
                        engines[arm]._step(spans)
                    sync(torch.device(device))
                    gc.collect()
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        engines[arm]._step(spans)
                    sync(torch.device(device))
                    times[(label, name)].append((time.perf_counter() - t0) / args.steps * 1e3)
    finally:
        autograd.linear = ours
    for name in SHAPES:
        base = statistics.median(times[("stock", name)])
        cells = [f"{label} {statistics.median(ts):.2f} ms ({statistics.median(ts) / base:.2f}x; "
                 f"{min(ts):.2f}-{max(ts):.2f})" for label, _, _ in arms for ts in [times[(label, name)]]]
        print(f"{args.model} {name}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
