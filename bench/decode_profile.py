"""Where a decode step's time goes, per arm: wall time, GPU kernel time and each kernel's share.

Run on a CUDA machine from the repository root:

    python bench/decode_profile.py [--model qwen2-0.5b] [--batch 1,32] [--arms stock,detent] [--steps 64]

Each arm loads the same checkpoint (a built-in config's seeded random weights, or a directory),
decodes `--batch` greedy requests from 128-token prompts with CUDA-graph decode, and profiles
`--steps` decode steps (after a warm-up run that captures the graphs) with the torch profiler
(CUPTI reports each kernel a graph replay launches). Prints per arm and batch: wall ms per step,
GPU kernel ms per step (kernels summed: the rest of the wall is host time and launch gaps), and
the kernels by time per step with their launches per step. Kernel names are shortened (Triton
kernels keep their function name; cuBLAS/CUTLASS kernels their family).
"""
from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import torch

from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams


def short(name: str) -> str:
    if "gemm" in name.lower() or "cutlass" in name or "sm90" in name:
        m = re.search(r"(sm\d+_xmma_gemm|cutlass\w*?gemm|gemv\w*|splitKreduce\w*|\w*gemm\w*)", name)
        return ("cuBLAS " + m.group(1))[:60] if m else name[:60]
    return name.split("(")[0][:60]


def profile_decode(engine: Engine, prompts: list[list[int]], steps: int) -> tuple[float, float, dict]:
    """(wall ms per step, GPU ms per step, {kernel: (launches per step, µs per step)}) over `steps`."""
    from torch.profiler import ProfilerActivity, profile
    b = len(prompts)

    def run(n: int) -> float:
        engine.flush_cache()
        params = [SamplingParams(seed=i, temperature=0.0, max_tokens=n) for i in range(b)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(steps + 1)  # warm-up: compiles, captures
    walls = sorted(run(steps + 1) - run(1) for _ in range(3))
    wall_ms = 1e3 * walls[1] / steps
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        run(steps + 1)
    with profile(activities=[ProfilerActivity.CUDA]) as p1:
        run(1)
    per = defaultdict(lambda: [0, 0.0])
    for prof, sign in ((p, 1), (p1, -1)):  # the prefill and first token cancel out
        for e in prof.events():
            if e.device_time > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
                k = per[short(e.name)]
                k[0] += sign
                k[1] += sign * e.device_time
    kernels = {n: (c / steps, us / steps) for n, (c, us) in per.items() if c > 0 or us > 0.5 * steps}
    gpu_ms = sum(us for _, us in kernels.values()) / 1e3
    return wall_ms, gpu_ms, kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--arms", default="stock,detent")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    batches = [int(b) for b in args.batch.split(",")]
    limits = dict(max_context=args.prompt_len + args.steps + 32, max_batch=max(64, max(batches)), max_num_tokens=8192)
    for arm in args.arms.split(","):
        model = load_model(path, arm, device="cuda", dtype=torch.bfloat16, **limits)
        for b in batches:
            g = torch.Generator().manual_seed(b)
            prompts = torch.randint(0, model.config.vocab_size, (b, args.prompt_len), generator=g).tolist()
            engine = Engine.for_requests(model, b, args.prompt_len + args.steps + 2, b)
            wall, gpu, kernels = profile_decode(engine, prompts, args.steps)
            launches = sum(c for c, _ in kernels.values())
            print(f"\n## {args.model}, arm {arm}, batch {b}: {wall:.3f} ms/step wall, {gpu:.3f} ms/step GPU kernels "
                  f"({launches:.0f} launches/step), {wall - gpu:.3f} ms/step host and gaps\n")
            print("| kernel | launches/step | µs/step | µs/launch |\n|---|---|---|---|")
            for name, (c, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]:
                print(f"| {name} | {c:.0f} | {us:.1f} | {us / c if c else float('nan'):.2f} |")
            del engine
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
