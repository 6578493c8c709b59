"""Decode attention's schedules on the GPU: time per call and whether a row keeps its bits.

    python3 bench/attention_decode_sweep.py [--cases 1x232,32x232,256x456,2x12000] [--splits 1024]
        [--schedules 64x64p7w4s2,16x128p7w4s3]   (block_m x block_n, pack, warps, stages)
        [--tree-sum 0,1]   (the row sum: a dot (0, the kernel's), tl.sum (1, the former; a control))

For each case (batch x context, one query per sequence, Qwen2-0.5B heads: 14 q, 2 kv, dim 64, 16-key
pages) and each schedule (block_m, block_n, pack, num_warps, num_stages): CUDA-graph replay time of
`paged_attention` (its combine included), median µs, and `bits`: whether every output row equals the
row computed by the prefill tile of the same KV tile width (64 rows of one head, 4 warps) — the
reference a trainer's prefill reproduces. A schedule whose bits match may serve decode while prefill
keeps its tile; block_n regroups the keys, so it is compared with its own width's prefill tile (the
reference runs without the KV prefetch; `f1` rows run with it).
"""
from __future__ import annotations

import argparse
import re

import torch
import triton
import triton.testing

from detent_rl.kernels.attention import attn_meta, paged_attention

H, KVH, D, PAGE = 14, 2, 64, 16
SCHEDULES = [  # block_m, block_n, pack, num_warps, num_stages
    (64, 64, 1, 4, 3), (64, 64, 7, 4, 3), (64, 64, 7, 4, 2), (16, 64, 7, 4, 3), (16, 64, 7, 1, 3),
    (16, 64, 7, 2, 3), (32, 64, 7, 4, 3), (64, 128, 7, 4, 2), (16, 128, 7, 4, 3), (16, 128, 7, 1, 3),
]


def run_case(batch: int, ctx: int, split: int, schedules: list, prefetches: list, tree_sum: bool) -> None:
    pages = -(-ctx // PAGE)
    g = torch.Generator(device="cuda").manual_seed(0)
    k_cache = torch.randn(batch * pages, PAGE, KVH, D, device="cuda", generator=g).to(torch.bfloat16)
    v_cache = torch.randn(batch * pages, PAGE, KVH, D, device="cuda", generator=g).to(torch.bfloat16)
    perm = torch.randperm(batch * pages, device="cuda", generator=g).to(torch.int32)
    table = perm.view(batch, pages)  # pages scattered over the pool
    q = torch.randn(batch, H, D, device="cuda", generator=g).to(torch.bfloat16)
    ctxs = [ctx - 1 - (i * 37) % max(1, ctx // 4) for i in range(batch)]  # ragged contexts
    num_splits = -(-max(4096, ctx) // split)
    refs = {}
    for bn in sorted({s[1] for s in schedules}):
        meta = attn_meta([1] * batch, ctxs, table, 64, 1)
        refs[bn] = paged_attention(q, k_cache, v_cache, meta, scale=D ** -0.5, block_n=bn, split_size=split,
                                   num_splits=num_splits, num_warps=4, num_stages=2, prefetch=False,
                                   tree_sum=tree_sum)
    for (bm, bn, pack, warps, stages), prefetch in ((s, f) for s in schedules for f in prefetches):
        meta = attn_meta([1] * batch, ctxs, table, bm, pack)
        fn = lambda: paged_attention(q, k_cache, v_cache, meta, scale=D ** -0.5, block_n=bn,  # noqa: E731
                                     split_size=split, num_splits=num_splits, num_warps=warps, num_stages=stages,
                                     prefetch=prefetch, tree_sum=tree_sum)
        try:
            out = fn()
            us = triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3
        except Exception as e:  # noqa: BLE001 - a schedule Triton cannot compile is reported, not fatal
            print(f"| {batch}x{ctx} | {split} | {bm}x{bn} pack {pack} w{warps} s{stages} f{prefetch:d} | failed: "
                  f"{str(e)[:80]} | |")
            continue
        bits = "=" if torch.equal(out, refs[bn]) else f"DIFF {(out != refs[bn]).any(-1).sum().item()} rows"
        print(f"| {batch}x{ctx} | {split} | {bm}x{bn} pack {pack} w{warps} s{stages} f{prefetch:d} | {us:.1f} | "
              f"{bits} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="1x232,32x232,256x456,2x12000")
    ap.add_argument("--splits", default="1024")
    ap.add_argument("--schedules", default="", help="e.g. 64x64p7w4s2,16x128p7w4s3 (default: a grid)")
    ap.add_argument("--prefetch", default="1,0", help="the kernel's KV prefetch, on (1) and/or off (0)")
    ap.add_argument("--tree-sum", default="0", help="the former tl.sum row sum (1), the dot's (0), or both (0,1)")
    args = ap.parse_args()
    schedules = SCHEDULES
    if args.schedules:
        pat = re.compile(r"(\d+)x(\d+)p(\d+)w(\d+)s(\d+)$")
        schedules = [tuple(int(g) for g in pat.match(x).groups()) for x in args.schedules.split(",")]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for tree in (bool(int(t)) for t in args.tree_sum.split(",")):
        print(f"\nrow sum: {'tl.sum (the former)' if tree else 'a dot'}\n")
        print("| batch x ctx | split | schedule (f: KV prefetch) | µs | bits vs prefill tile |")
        print("|---|---|---|---|---|")
        for split in (int(s) for s in args.splits.split(",")):
            for case in args.cases.split(","):
                b, c = (int(x) for x in case.split("x"))
                run_case(b, c, split, schedules, [bool(int(f)) for f in args.prefetch.split(",")], tree)


if __name__ == "__main__":
    main()
