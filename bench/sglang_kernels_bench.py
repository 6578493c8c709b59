"""SGLang's own Triton decode attention (its split selection and `decode_attention_fwd`, SGLang 0.5.23)
under three selections, side by side: SGLang's stock heuristic, its deterministic mode's fixed
256-key tile, and the DETENT plugin's pinned tiles (`--tiles`, the tuple's `split_tile_size`).

    python3 -P bench/sglang_kernels_bench.py [--heads 32,8,128] [--cases 1x4000,8x2000,64x2000,256x1000,2x12000]
        [--tiles 256,512,1024] [--context 16384]

Each step is the split counts plus the attention, timed as CUDA-graph replays
(triton.testing.do_bench_cudagraph), µs. `bits`: request 0's output row decoded alone and inside the
case's batch, equal (`=`) or not. Lengths: each case's batch of `n x L` has lengths spread ±10 %
around L (a GRPO group's completions), request 0 at L. Needs SGLang's package (tests/sglang_env.py;
on the device, the wheels `bench/sglang_wheels.sh` fetches).
"""
from __future__ import annotations

import argparse
import os
import random
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from sglang_env import import_sglang  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="32,8,128", help="query heads, KV heads, head dim")
    ap.add_argument("--cases", default="1x4000,8x2000,64x2000,256x1000,2x12000")
    ap.add_argument("--tiles", default="256,512,1024", help="the DETENT arm's split tiles")
    ap.add_argument("--context", type=int, default=16384, help="the deployment's context (split buffers)")
    args = ap.parse_args()
    import_sglang()
    from sglang_decode_cases import Batch, backend
    heads, kv_heads, dim = (int(v) for v in args.heads.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    arms = [("stock", 0), ("deterministic", 256)] + [("detent", int(t)) for t in args.tiles.split(",")]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"sglang {__import__('sglang').__version__}; heads {heads}/{kv_heads} x {dim}, bf16; us per step")
    names = [a if a != "detent" else f"detent {t}" for a, t in arms]
    print("| case | " + " | ".join(names) + " | bits (alone = in batch) |")
    print("|---|" + "---|" * (len(arms) + 1))
    for case in args.cases.split(","):
        n, length = (int(v) for v in case.split("x"))
        rng = random.Random(0)
        lens = [length] + [max(1, round(length * rng.uniform(0.9, 1.1))) for _ in range(n - 1)]
        batch = Batch(lens, num_head=heads, num_kv_head=kv_heads, dim=dim, dtype=torch.bfloat16, device="cuda")
        times, bits = [], []
        for arm, tile in arms:
            be, select = backend(arm, num_head=heads, num_kv_head=kv_heads, context=args.context, sms=sms, tile=tile)
            run = batch.step(batch.inputs(list(range(n)), be), be, select)
            times.append(triton.testing.do_bench_cudagraph(run, rep=20) * 1e3)
            alone, _ = batch.row(0, [0], be, select)
            inside, _ = batch.row(0, list(range(n)), be, select)
            bits.append("=" if torch.equal(alone, inside) else "≠")
        cells = [f"{times[0]:.1f}"] + [f"{t:.1f} ({t / times[0]:.2f}x)" for t in times[1:]]
        print(f"| {case} | " + " | ".join(cells) + " | " + " ".join(bits) + " |", flush=True)


if __name__ == "__main__":
    main()
