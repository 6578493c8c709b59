"""Host time of the GRPO batch's prefill step before its forward: the scheduler's admissions and the step's inputs.

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/prefill_host_bench.py [--model tiny]
        [--prompts 32] [--samples 8] [--prompt-len 200] [--max-num-tokens 8192] [--reps 7] [--profile 14]

The batch's requests (each prompt `--samples` times in a row, as a GRPO group) are added to a flushed
engine, then timed: `Scheduler.schedule()` (admissions: blocks, prefix hashes, the step's spans) and
`step_inputs` (token ids, positions, cache slots, the page table and the attention metadata), the host
work that runs before the step's first kernel is launched. Nothing here depends on the device or the
model's size (the built-in `tiny` model on the CPU by default). Prints the median of `--reps` (after two
warm-ups) and, with `--profile N`, cProfile's N costliest functions by own time. It measures the
checked-out code: run it at two commits to compare them.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time

import torch

from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.models.runner import Span as StepSpan, step_inputs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--max-num-tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", type=int, default=0)
    args = ap.parse_args()
    model = load_model(builtin_checkpoint(args.model), "detent", device="cpu", dtype=torch.float32,
                       max_num_tokens=args.max_num_tokens)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    groups = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    batch = [p for p in groups for _ in range(args.samples)]
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=1) for i in range(len(batch))]
    engine = Engine.for_requests(model, len(batch), args.prompt_len + 1, len(batch))

    def once() -> tuple[float, float, int]:
        engine.flush_cache()
        for p, sp in zip(batch, params):
            engine.add(p, sp)
        t0 = time.perf_counter()
        spans = engine.scheduler.schedule()
        t1 = time.perf_counter()
        step_inputs(engine.model, engine.caches,
                    [StepSpan(s.seq.tokens[s.start:s.start + s.count], s.start, s.seq.block_table) for s in spans])
        t2 = time.perf_counter()
        for s in list(engine.scheduler.running):  # the requests leave, unrun: the next repetition admits them again
            engine.scheduler._preempt(s)
        engine.scheduler.waiting.clear()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, sum(s.count for s in spans)

    times = [once() for _ in range(args.reps + 2)][2:]
    tokens = times[0][2]
    print(f"{len(batch)} requests ({args.prompts} prompts x {args.samples}), {args.prompt_len}-token prompts, "
          f"{tokens} tokens in the step: schedule {statistics.median(t[0] for t in times):.2f} ms, "
          f"step inputs {statistics.median(t[1] for t in times):.2f} ms (median of {args.reps})")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        once()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
