"""The chunked (pinned K partition) linear against cuBLAS and our tile-pinned linear, per 0.5B site.

    python3 bench/chunked_matmul_bench.py [--chunk 128]

For each linear site of the Qwen2-0.5B config and M in 1..8192: cuBLAS (`torch.nn.functional.linear`,
what a stock engine runs), our `linear` with the detent arm's default tuple, and the chunked kernel's
best parallel and best sequential schedule over a small grid (the parallel form only for M <= 512).
Times are CUDA-graph replays (triton.testing.do_bench_cudagraph), median microseconds.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

from detent_rl.kernels.chunked_matmul import chunked_linear
from detent_rl.kernels.matmul import linear, tile_params
from detent_rl.kernels.selections import Deployment, KernelSelections

SITES = {"qkv": (1152, 896, True), "o": (896, 896, False), "gate_up": (9728, 896, False),
         "down": (896, 4864, False), "lm_head": (151936, 896, False)}
MS = (1, 8, 32, 128, 512, 2048, 8192)
PARALLEL = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 3), (32, 64, 64, 4, 4), (64, 64, 64, 4, 3)]
SEQUENTIAL = [(64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 64, 64, 4, 4)]


def timed(fn) -> float:
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3
    except Exception:
        return triton.testing.do_bench(fn, rep=50) * 1e3


def best(x, w, b, chunk, parallel, grid) -> tuple[float, tuple]:
    out = []
    for bm, bn, bk, warps, stages in grid:
        if chunk % bk:
            continue
        fn = lambda: chunked_linear(x, w, b, chunk=chunk, parallel=parallel, block_m=bm, block_n=bn, block_k=bk,
                                    num_warps=warps, num_stages=stages)
        out.append((timed(fn), (bm, bn, bk, warps, stages)))
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunk", type=int, default=128)
    args = ap.parse_args()
    deployment = Deployment(num_heads=14, num_kv_heads=2, head_dim=64, hidden=896, vocab=151936)
    sel = KernelSelections(deployment, "detent")
    print(f"chunk {args.chunk}; microseconds per call (CUDA-graph replay); ratios to cuBLAS")
    print("| site | M | cuBLAS | detent default tile | chunked parallel | chunked sequential | best chunked / cuBLAS |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k, bias) in SITES.items():
        w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
        b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if bias else None
        pinned = sel.get("matmul", n=n, k=k)
        for m in MS:
            x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
            cublas = timed(lambda: F.linear(x, w, b))
            ours = timed(lambda: linear(x, w, b, **tile_params(pinned(m))))
            par = best(x, w, b, args.chunk, True, PARALLEL) if m <= 512 else (float("nan"), ())
            seq = best(x, w, b, args.chunk, False, SEQUENTIAL)
            top = min(t for t in (par[0], seq[0]) if t == t)
            print(f"| {name} {n}x{k} | {m} | {cublas:.1f} | {ours:.1f} ({ours / cublas:.2f}x) | "
                  f"{par[0]:.1f} {par[1]} | {seq[0]:.1f} {seq[1]} | **{top / cublas:.2f}x** |", flush=True)


if __name__ == "__main__":
    main()
