"""Stock's order effect (session 59): why is stock's batch-1 step ~10 % slower after another arm's run in the same
process, though not as the process's first run?

Run on a CUDA machine from the repository root:

    python3 -P bench/order_probe.py --commitment bench/tuned/h200_qwen2-0.5b_decode1.json [--model qwen2-0.5b]

The suspect: `detent_rl.bench.run` drops each run's model and engines (`del`, then `torch.cuda.empty_cache()`)
without a collection, and an engine left in a reference cycle keeps its CUDA graphs and their memory pools until
the collector reaches it (`bench_cases._reserved`). This probe calls the bench's own `run` once per run, as the
rounds of one process do, decode-1 only, in this order:

1. stock, the process's first run (every run on the tuple's deployment, the bench's own);
2. tuned (the detent arm with `--commitment`; without one, detent on its default tuple);
3. stock, after it, nothing collected (session 59's slow case);
4. the same arm again;
5. stock, after a `gc.collect()` and `empty_cache()` (the fix, if the suspect is the cause).

After each run it prints the CUDA graphs and engines still alive (found by the collector's object list, before
any collection), and the allocator's reserved and allocated bytes. The `--quick` shapes make a smoke test that also
runs on the CPU (no graphs there).
"""
from __future__ import annotations

import argparse
import gc
import warnings

import torch

from detent_rl.bench import case_limits, run
from detent_rl.bench_cases import QUICK, Shapes
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.rollout.engine import Engine

ORDER = (("stock", False), ("other", False), ("stock", False), ("other", False), ("stock", True))  # (arm, collect)


def alive() -> dict[str, int]:
    """CUDA graphs and engines the process still holds, without collecting (a cycle's members count)."""
    objects = gc.get_objects()
    with warnings.catch_warnings():  # (isinstance on a deprecated module's proxy warns)
        warnings.simplefilter("ignore")
        held = [(isinstance(o, torch.cuda.CUDAGraph), isinstance(o, Engine)) for o in objects]
    return {"graphs": sum(g for g, _ in held), "engines": sum(e for _, e in held)}


def memory(device: str) -> str:
    if not device.startswith("cuda"):
        return "-"
    return f"{torch.cuda.memory_reserved() / 2**30:.2f} / {torch.cuda.memory_allocated() / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--commitment", help="the tuned arm's tuple (a batch-1 tune; every run takes its deployment); "
                                         "without one the other arm is detent on its default tuple")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    args = ap.parse_args(argv)
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    shapes = QUICK if args.quick else Shapes()
    cuda = args.device.startswith("cuda")
    tuple_ = CommitmentTuple.load(args.commitment) if args.commitment else None
    limits = {"decode-1": {k: tuple_.deployment[k] for k in ("max_context", "max_batch", "max_num_tokens")}
              if tuple_ is not None else case_limits(["decode-1"], shapes, {"": 8192})["decode-1"]}
    other = "tuned" if tuple_ is not None else "detent"

    def load(arm, file, lim):
        return load_model(path, "detent" if arm == "tuned" else arm, device=args.device,
                          dtype=torch.bfloat16 if cuda or tuple_ is not None else torch.float32,
                          commitment=tuple_ if file else None, **lim)
    print("| # | run | collected before | ms/step | graphs, engines alive after | reserved / allocated after |")
    print("|---|---|---|---|---|---|")
    for i, (arm, collect) in enumerate(ORDER, 1):
        arm = other if arm == "other" else arm
        if collect:
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        r = run(load, ["decode-1"], shapes, 0.5, log=lambda _: None, arms=(arm,), stock_pdl=("on",),
                tuned={"decode-1": args.commitment} if tuple_ is not None else None, limits=limits,
                step_graphs=("whole" if cuda else False,))
        ms = r["cases"]["decode-1"][arm]["ms_per_step"]
        held = alive()
        print(f"| {i} | {arm} | {'yes' if collect else 'no'} | {ms:.3f} | {held['graphs']}, {held['engines']} | "
              f"{memory(args.device)} |", flush=True)


if __name__ == "__main__":
    main()
