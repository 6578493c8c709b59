"""Host time of a graphed decode step: what the engine does around the forward, per step, on the CPU.

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/host_step_bench.py [--batches 1,32,256]
        [--prompt-len 128] [--steps 256] [--profile 32]

A GPU decode step is serialized with its host work (one sync a step reads the sampled tokens), so
every microsecond the engine spends choosing the running sequences, staging their inputs and
appending the results is lost. This measures that work alone: the built-in `tiny` model on the CPU,
the engine's decode graphs run uncaptured (`DecodeGraphs(capture=False)`, the same staging as the
GPU's), and — in this script only — the graph's forward replaced by a stub that returns the input
tokens with zero logprobs, so the step does everything a replay surrounds and nothing a replay does.
The prefills run the real model and are not timed. Every row samples at temperature 1 with no
top-k/top-p (RL's decode: the graph samples too). Prints, per batch, the median and mean host
microseconds per decode step (step wall minus the stub's); `--profile B` prints cProfile's top
functions of batch B's decode steps. On the CPU nothing runs asynchronously, so overlapped decode
(the default; `--no-overlap` turns it off) shows here only as its own extra cost: on the GPU the
host work it moves runs under the next step's replay. It measures the checked-out code: run it at two commits to
compare them.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.rollout.cuda_graph import DecodeGraphs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams


def decoding_engine(model, batch: int, prompt_len: int, steps: int) -> Engine:
    """An engine with `batch` requests admitted and prefilled, every one about to decode."""
    engine = Engine.for_requests(model, batch, prompt_len + steps + 2, batch)
    engine.graphs = DecodeGraphs(model, engine.caches, len(engine.blocks.blocks), batch, capture=False)
    vocab = model.config.vocab_size
    for i in range(batch):
        prompt = [(7 * i + 3 * j + 1) % vocab for j in range(prompt_len)]
        engine.add(prompt, SamplingParams(seed=i, temperature=1.0, max_tokens=steps + 2))
    while any(len(s) == s.num_prompt for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    return engine


def stub_forward(graphs: DecodeGraphs, stub_seconds: list[float]):
    zeros = torch.zeros(graphs.max_batch, dtype=torch.float32)

    def forward(b: int, temperature: float | None):
        t0 = time.perf_counter()
        out = (graphs.input_ids[:b], zeros[:b])
        stub_seconds.append(time.perf_counter() - t0)
        return out
    return forward


def host_us(engine: Engine, steps: int, profile: cProfile.Profile | None, warmup: bool = False) -> list[float]:
    """Host microseconds of each of `steps` decode steps (`warmup`: unchecked, e.g. the overlapped
    engine's first step, which launches its own step and the one ahead)."""
    stub: list[float] = []
    engine.graphs._forward = stub_forward(engine.graphs, stub)
    walls = []
    for _ in range(steps):
        stub.clear()
        if profile:
            profile.enable()
        t0 = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - t0
        if profile:
            profile.disable()
        if len(stub) != 1 and not warmup:
            raise RuntimeError(f"a decode step ran {len(stub)} graph forwards, not one")
        walls.append((wall - sum(stub)) * 1e6)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--profile", type=int, default=0, help="cProfile this batch's decode steps")
    ap.add_argument("--no-overlap", action="store_true", help="the engine without overlapped decode")
    args = ap.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    model = load_model(builtin_checkpoint("tiny"), "detent", dtype=torch.float32, max_batch=max(batches),
                       max_context=4096)
    print("| batch | host us/step (median) | mean | steps |\n|---|---|---|---|")
    for batch in batches:
        engine = decoding_engine(model, batch, args.prompt_len, args.warmup + args.steps)
        engine.overlap = not args.no_overlap
        host_us(engine, args.warmup, None, warmup=True)
        profile = cProfile.Profile() if batch == args.profile else None
        us = host_us(engine, args.steps, profile)
        print(f"| {batch} | {statistics.median(us):.1f} | {statistics.mean(us):.1f} | {len(us)} |", flush=True)
        if profile:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
