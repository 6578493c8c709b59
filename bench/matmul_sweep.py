"""The matmul's schedule grid per site, K partition and M, against cuBLAS: the data the matmul
selection's schedule table and its default K partition are chosen from.

    python3 bench/matmul_sweep.py [--models 0.5b,1.5b] [--chunks 128,256,512,0] [--ms 1,8,32,128,512,2048,8192]
        [--sites down,qkv] [--parallel-up-to 128] [--flat]

For each linear site of the Qwen2-0.5B / 1.5B configs, each M and each K partition (`chunk`, 0 = one
chunk of all K): cuBLAS (`torch.nn.functional.linear`), and our `linear`'s best parallel and best
sequential schedule over a small grid, with the winning tile. Times are CUDA-graph replays
(triton.testing.do_bench_cudagraph) over rotating weight copies (`timing.cold_copies`: read from
HBM, as in a step, not from L2), median microseconds. The `bits` column checks the claim the
schedule rests on: row 0 of every schedule and M equals row 0 of the first one measured.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton.testing

from detent_rl.kernels.matmul import linear
from detent_rl.timing import cold_copies

# (name, n, k, bias) per model: qkv, o, gate_up, down, LM head
SITES = {
    "0.5b": [("qkv", 1152, 896, True), ("o", 896, 896, False), ("gate_up", 9728, 896, False),
             ("down", 896, 4864, False), ("lm_head", 151936, 896, False)],
    "1.5b": [("qkv", 2048, 1536, True), ("o", 1536, 1536, False), ("gate_up", 17920, 1536, False),
             ("down", 1536, 8960, False), ("lm_head", 151936, 1536, False)],
}
# block_m, block_n, block_k, num_warps, num_stages
PARALLEL = [(16, 64, 128, 4, 4), (16, 64, 64, 4, 6), (16, 128, 128, 4, 3), (32, 64, 64, 4, 4), (16, 32, 128, 4, 4),
            (64, 64, 64, 4, 3), (16, 16, 128, 4, 4), (16, 32, 64, 4, 6), (64, 128, 64, 4, 3)]
SEQUENTIAL = [(16, 64, 128, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3),
              (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (64, 256, 64, 8, 3)]


def timed(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=10) * 1e3


def sweep(x, w, b, chunk, parallel, grid, ref_row, flat=False):
    best, ok = (float("inf"), None), True
    for bm, bn, bk, warps, stages in grid:
        if chunk % bk:
            continue
        fn = lambda: linear(x, w(), b, chunk=chunk, parallel=parallel, block_m=bm, block_n=bn, block_k=bk,
                            num_warps=warps, num_stages=stages, flat=flat)
        out = fn()
        if ref_row is not None and not torch.equal(out[0], ref_row):
            ok = False
        best = min(best, (timed(fn), (bm, bn, bk, warps, stages)))
    return best, ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument("--chunks", default="128,256,512,0")
    ap.add_argument("--ms", default="1,8,32,128,512,2048,8192")
    ap.add_argument("--sites", default="", help="comma-separated site names (default: all)")
    ap.add_argument("--parallel-up-to", type=int, default=128, help="the largest M the parallel form is tried at")
    ap.add_argument("--flat", action="store_true", help="also the sequential schedule as one flat loop over K "
                                                          "(`linear(flat=True)`), where K has several chunks")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    rows = []
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; us per call")
    print("| model | site | M | cuBLAS | chunk | parallel best | sequential best | flat best | best / cuBLAS | bits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    g = torch.Generator(device="cuda").manual_seed(0)
    for model in args.models.split(","):
        for name, n, k, bias in SITES[model]:
            if args.sites and name not in args.sites.split(","):
                continue
            w0 = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
            w = cold_copies(w0)  # read from HBM at every call, as in a step, not from L2
            b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if bias else None
            big = torch.randn(max(ms), k, generator=g, device="cuda").to(torch.bfloat16)
            for chunk in (int(c) or k for c in args.chunks.split(",")):
                chunk = -(-chunk // 128) * 128
                ref_row = None
                for m in ms:
                    if name == "lm_head" and m > 2048:
                        continue
                    x = big[:m]
                    cublas = timed(lambda: F.linear(x, w(), b))
                    if ref_row is None:
                        ref_row = linear(x, w0, b, chunk=chunk, parallel=False, block_m=64, block_n=64, block_k=64)[0]
                    par, ok1 = sweep(x, w, b, chunk, True, PARALLEL, ref_row) \
                        if m <= args.parallel_up_to and chunk < k else ((float("nan"), None), True)
                    seq, ok2 = sweep(x, w, b, chunk, False, SEQUENTIAL, ref_row)
                    flat, ok3 = sweep(x, w, b, chunk, False, SEQUENTIAL, ref_row, flat=True) \
                        if args.flat and chunk < k else ((float("nan"), None), True)
                    ok2 = ok2 and ok3
                    top = min(t for t in (par[0], seq[0], flat[0]) if t == t)
                    rows.append({"model": model, "site": name, "n": n, "k": k, "m": m, "chunk": chunk,
                                 "cublas": cublas, "parallel": par, "sequential": seq, "flat": flat,
                                 "bits_equal": ok1 and ok2})
                    print(f"| {model} | {name} {k}->{n} | {m} | {cublas:.1f} | {chunk} | {par[0]:.1f} {par[1]} | "
                          f"{seq[0]:.1f} {seq[1]} | {flat[0]:.1f} {flat[1]} | {top / cublas:.2f}x | "
                          f"{'=' if ok1 and ok2 else 'DIFF'} |", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
