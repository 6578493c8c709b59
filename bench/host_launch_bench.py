"""The host's cost of one eager forward, per arm: how long Python takes to launch it against how long the GPU
takes to run it.

Run on a CUDA machine from the repository root:

    python3 -P bench/host_launch_bench.py [--model qwen2-0.5b] [--arms stock,detent] [--tokens 8192,256] \
        [--prompt-len 200] [--reps 10] [--host-top 25] [--commitment TUPLE.json]

Each arm loads the same checkpoint and runs one prefill step of `--tokens` tokens (sequences of
`--prompt-len` tokens, as the GRPO batch's prefill and the trainer's forward are) through the model,
eagerly (no CUDA graph: a prefill step's shape changes with the batch). Per forward it reports:
- host: the wall time of the forward's Python call, started with the device idle and ended before any
  synchronisation. A launch never waits for the device here (the launch queue holds ~1,000 kernels), so this
  is the time the host takes to launch the forward;
- wall: the same call to the device's completion;
- GPU: the forward's kernels summed (torch profiler, one more forward), and the launches.
A forward with host >= GPU is host-bound: its kernels wait for their launches. `--host-top N` prints the
host's N costliest functions by own time over one more forward (cProfile). `--commitment` adds the arm
`tuned` (detent with that tuple). `--launch direct,triton` times each forward's host under both launch paths
of our Triton kernels (`kernels.launch.launch`: the compiled kernel found by Triton's own key and launched
directly, or Triton's `JITFunction.run`, DETENT_LAUNCH=triton), alternating rep by rep, and checks that both
paths give the same logits, bit for bit.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_profile import _per_kernel  # noqa: E402  (bench/ is a folder of scripts)

from detent_rl.kernels.commitment import CommitmentTuple  # noqa: E402
from detent_rl.models import load_model, set_context  # noqa: E402
from detent_rl.models.builtin import NAMES, builtin_checkpoint  # noqa: E402
from detent_rl.models.runner import Span, step_inputs  # noqa: E402


def forward_inputs(model, tokens: int, prompt_len: int, seed: int = 0):
    """(input_ids, positions, context) of one prefill step of `tokens` tokens in `prompt_len`-token sequences
    (the last one shorter), in fresh pages."""
    g = torch.Generator().manual_seed(seed)
    lens = [prompt_len] * (tokens // prompt_len) + ([tokens % prompt_len] if tokens % prompt_len else [])
    page, spans, at = model.page_size, [], 0
    for n in lens:
        pages = -(-n // page)
        spans.append(Span(torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist(), 0,
                          list(range(at, at + pages))))
        at += pages
    return step_inputs(model, model.allocate_kv_cache(at), spans)


@torch.inference_mode()
def measure(model, tokens: int, prompt_len: int, reps: int, host_top: int, launches: list[str]) -> dict:
    ids, pos, ctx = forward_inputs(model, tokens, prompt_len)

    def forward():
        with set_context(ctx):
            return model(ids, pos)

    logits = {}
    for path in launches:  # compiles, autotunes, fills the allocator's cache; both paths' logits
        os.environ["DETENT_LAUNCH"] = path
        for _ in range(3):
            logits[path] = forward()
    if len({t.view(torch.int16).cpu().numpy().tobytes() for t in logits.values()}) != 1:
        raise SystemExit(f"the launch paths {launches} gave different logits: a wrong compiled variant")
    host = {path: [] for path in launches}
    wall = {path: [] for path in launches}
    for _ in range(reps):
        for path in launches:
            os.environ["DETENT_LAUNCH"] = path
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host[path].append(1e3 * (t1 - t0))
            wall[path].append(1e3 * (t2 - t0))
    os.environ["DETENT_LAUNCH"] = launches[0]
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        forward()
        torch.cuda.synchronize()
    gpu, kernels, _ = _per_kernel(p, 1)
    if host_top:
        with cProfile.Profile() as prof:
            forward()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(host_top)
    os.environ.pop("DETENT_LAUNCH")
    return {"host": {k: statistics.median(v) for k, v in host.items()},
            "wall": {k: statistics.median(v) for k, v in wall.items()}, "gpu": gpu,
            "launches": sum(c for c, _ in kernels.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--arms", default="stock,detent")
    ap.add_argument("--tokens", default="8192,256")
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--host-top", type=int, default=0)
    ap.add_argument("--commitment", default="")
    ap.add_argument("--launch", default="direct", help="comma-separated launch paths, of direct, triton")
    args = ap.parse_args()
    launches = [x.strip() for x in args.launch.split(",") if x.strip()]
    if not launches or set(launches) - {"direct", "triton"}:
        ap.error(f"--launch {args.launch!r}: give direct, triton or both")
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    sizes = [int(t) for t in args.tokens.split(",")]
    limits = dict(max_context=max(args.prompt_len, 64), max_batch=max(sizes), max_num_tokens=max(sizes))
    commitment = CommitmentTuple.load(args.commitment) if args.commitment else None
    if commitment is not None:
        limits = {k: commitment.deployment[k] for k in limits}
    arms = args.arms.split(",") + (["tuned"] if commitment is not None else [])
    print("| arm | tokens | launch | host ms | wall ms | GPU ms (kernels summed) | launches | host / GPU |\n"
          "|---|---|---|---|---|---|---|---|")
    for arm in arms:
        model = load_model(path, "detent" if arm == "tuned" else arm, device="cuda", dtype=torch.bfloat16,
                           commitment=commitment if arm == "tuned" else None, **limits)
        for tokens in sizes:
            r = measure(model, tokens, args.prompt_len, args.reps, args.host_top, launches)
            for way in launches:
                print(f"| {arm} | {tokens} | {way} | {r['host'][way]:.2f} | {r['wall'][way]:.2f} | {r['gpu']:.2f} | "
                      f"{r['launches']:.0f} | {r['host'][way] / r['gpu']:.2f} |", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
