"""A colocated rollout after `release_memory`: the engine that drops its graphs with the freed cache against the one
whose cache keeps its addresses (`Engine(releasable=True)`, `rollout/vmm.py`), in one process on the same model.

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/release_bench.py [--model qwen2-0.5b] \
        [--prompts 32] [--samples 8] [--prompt-len 200] [--new-tokens 256] [--rounds 3] [--commitment TUPLE.json]
        [--max-context 784]

Each engine is warmed up (`Engine.warmup`: every graph captured), then per round: the GRPO-shaped batch (`--prompts`
x `--samples` sequences of `--prompt-len` random tokens, `--new-tokens` sampled at T = 1), `release_memory`, the
same batch again. Prints per engine the median of the rounds: the batch's seconds before and after the release, the
seconds the release and the memory's return took, the graphs captured in the batch after the release, the bytes
freed, and whether the batch after the release gave the first batch's tokens and logprobs. The recipes' step is the
same sequence (`rollout.release_memory`: release after the rollout, the update, then the next rollout).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from detent_rl.bench_cases import _prompts
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.timing import sync


def _captured(engine: Engine) -> int:
    return sum(len(g.graphs) for g in (engine.graphs, engine.steps) if g is not None)


def _timed(engine: Engine, prompts, params) -> tuple[float, list]:
    sync(engine.model.device)
    t0 = time.perf_counter()
    seqs = engine.generate(prompts, params)
    sync(engine.model.device)
    return time.perf_counter() - t0, [(s.completion, s.logprobs) for s in seqs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commitment", default="")
    ap.add_argument("--max-context", type=int, default=784, help="the deployment's (the bench's short cases' and "
                    "their tuples')")
    args = ap.parse_args()
    if args.prompt_len + args.new_tokens > args.max_context:
        ap.error(f"--prompt-len {args.prompt_len} + --new-tokens {args.new_tokens} exceed --max-context "
                 f"{args.max_context}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    batch = args.prompts * args.samples
    context = args.prompt_len + args.new_tokens
    model = load_model(builtin_checkpoint(args.model), "detent", device=device, dtype=dtype,
                       commitment=CommitmentTuple.load(args.commitment) if args.commitment else None,
                       max_context=args.max_context, max_batch=max(batch, 256), max_num_tokens=8192)
    group = _prompts(args.prompts, args.prompt_len, model.config.vocab_size, seed=0)
    prompts = [p for p in group for _ in range(args.samples)]
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=args.new_tokens) for i in range(batch)]
    pieces = device == "cuda"
    for releasable in (False, True):
        engine = Engine.for_requests(model, batch, context, batch, step_graphs=pieces, releasable=releasable)
        if device == "cuda":
            engine.warmup()
        before, after, release, same, recaptured, freed = [], [], [], True, [], 0
        for _ in range(args.rounds):
            t, first = _timed(engine, prompts, params)
            before.append(t)
            t0 = time.perf_counter()
            freed = engine.release_memory()
            if device == "cuda":
                torch.cuda.empty_cache()  # what the colocated worker does (`RolloutWorker.release_memory`)
            release.append(time.perf_counter() - t0)
            kept = _captured(engine)  # what the release left captured
            t, again = _timed(engine, prompts, params)
            after.append(t)
            recaptured.append(_captured(engine) - kept)
            same = same and again == first
        med = statistics.median
        print(f"{args.model} {batch} x {args.new_tokens}, releasable={releasable} "
              f"(cache at kept addresses: {engine.memory is not None}): batch {med(before):.3f} s, after the "
              f"release {med(after):.3f} s ({med(after) / med(before):.2f}x); release {1e3 * med(release):.1f} ms; "
              f"graphs captured after it {med(recaptured):.0f}; freed {freed / 2 ** 30:.2f} GiB; "
              f"bits {'the same' if same else 'DIFFERENT'}", flush=True)
        del engine


if __name__ == "__main__":
    main()
