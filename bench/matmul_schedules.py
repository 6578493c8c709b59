"""Each linear site's selected schedule per M, and how many units (tiles x parallel chunks) it launches, on the meta
device (no GPU, no weights): where a bucket's tiles leave the multiprocessors idle.

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/matmul_schedules.py [--model qwen2-1.5b]
        [--ms 256,512,640,1024,2048] [--commitment TUPLE.json]

The model is built in the detent arm (the default tuple, or --commitment's) at the bench's Poisson deployment; the
device facts off the GPU are the H200's (132 multiprocessors: `kernels.selections.H200`). A unit is an output tile,
times the chunks where the chunks run in parallel programs (`tile_parallel`); a persistent schedule runs its units in
at most as many programs as the SMs hold.
"""
from __future__ import annotations

import argparse

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.models.layers import Linear

POISSON = dict(max_context=784, max_batch=256, max_num_tokens=8192)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-1.5b", help="a built-in name or an HF checkpoint directory")
    ap.add_argument("--ms", default="256,512,640,1024,2048")
    ap.add_argument("--commitment", help="a tuned tuple (its deployment)")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",") if m]
    tuple_ = CommitmentTuple.load(args.commitment) if args.commitment else None
    limits = {k: tuple_.deployment[k] for k in POISSON} if tuple_ else POISSON
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    model = load_model(path, "detent", device="meta", dtype=torch.bfloat16, commitment=tuple_, **limits)
    sms = model.selections.deployment.num_sms
    print(f"{args.model}, {sms} SMs; per site and M: chunk, form, tile (M x N x K), warpgroup, persistent, units\n")
    print("| site | M | chunk | form | tile | wgmma | persistent | units | units / SMs |")
    print("|---|---|---|---|---|---|---|---|---|")
    seen = set()
    for module in model.modules():
        if not isinstance(module, Linear) or tuple(module.weight.shape) in seen:
            continue
        seen.add(tuple(module.weight.shape))
        n, k = module.weight.shape
        select = model.selections.get("matmul", n=n, k=k)
        for m in ms:
            s = select(m)
            units = -(-m // s.tile_block_m) * -(-n // s.tile_block_n) * (-(-k // s.chunk) if s.tile_parallel else 1)
            print(f"| {k}->{n} | {m} | {s.chunk} | {'parallel' if s.tile_parallel else 'sequential'} | "
                  f"{s.tile_block_m}x{s.tile_block_n}x{s.tile_block_k} | {'yes' if s.tile_wgmma else 'no'} | "
                  f"{'yes' if s.tile_persistent else 'no'} | {units} | {units / sms:.2f} |")


if __name__ == "__main__":
    main()
