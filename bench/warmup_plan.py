"""The engine warm-up's plan per arm, without a GPU: how many synthetic steps `Engine.warmup` would run, by kind.

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/warmup_plan.py [--model qwen2-0.5b]
        [--arms stock,detent,corun,det] [--commitment TUPLE.json] [--step-graphs off,on]

Each arm's model is built on the meta device (no weights) at the bench's Poisson deployment (`python -m
detent_rl.bench`: 784-token contexts, 256 sequences, 8,192 tokens a step; a tuple's own with `--commitment`), and an
engine for the Poisson case's 64 requests (64 in flight) plans its warm-up (`rollout.warmup.planned_steps`): one
step per class of steps its kernels tell apart. A step is a prefill (no cached tokens), a short step (two-token
queries) or a mixed one (a chunk beside decode rows). The plan reads the selections only, whose device facts off
the GPU are the H200's (`kernels.selections.H200`: 132 multiprocessors, which the stock arm's KV split reads), so it
is the H200's plan. Run it at two commits to see what a change to the warm-up's classes costs in steps before device
time is spent on it.
"""
from __future__ import annotations

import argparse
import collections
import time

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.warmup import planned_steps

POISSON = dict(max_context=784, max_batch=256, max_num_tokens=8192)  # the bench's serving cases' deployment


def kind(q_lens: list[int], cached: list[int]) -> str:
    if all(c == 0 for c in cached):
        return "prefill"
    return "mixed" if len(q_lens) > 1 and q_lens[0] > 2 else "short"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", help="a built-in name or an HF checkpoint directory")
    ap.add_argument("--arms", default="stock,detent,corun,det")
    ap.add_argument("--commitment", help="adds the arm `tuned` (detent with this tuple, at its deployment)")
    ap.add_argument("--step-graphs", default="off,on", help="comma-separated off/on: the engine's piecewise graphs")
    args = ap.parse_args()
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    tuple_ = CommitmentTuple.load(args.commitment) if args.commitment else None
    limits = {k: tuple_.deployment[k] for k in POISSON} if tuple_ else POISSON
    arms = [a for a in args.arms.split(",") if a] + (["tuned"] if tuple_ else [])
    print(f"{args.model}, deployment {limits}, an engine for 64 requests of 768 tokens, 64 in flight\n")
    print("| arm | step graphs | steps planned | prefill | short | mixed | s (meta load + plan) |")
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        for pieces in (p == "on" for p in args.step_graphs.split(",")):
            t0 = time.perf_counter()
            model = load_model(path, "detent" if arm == "tuned" else arm, device="meta", dtype=torch.bfloat16,
                               commitment=tuple_ if arm == "tuned" else None, **limits)
            steps = planned_steps(Engine.for_requests(model, 64, 768, 64, step_graphs=pieces))
            kinds = collections.Counter(kind(q, c) for q, c, _ in steps)
            print(f"| {arm} | {'on' if pieces else 'off'} | {len(steps)} | {kinds['prefill']} | {kinds['short']} | "
                  f"{kinds['mixed']} | {time.perf_counter() - t0:.1f} |")


if __name__ == "__main__":
    main()
