"""The gated MLP's first half three ways, per M: stock (cuBLAS's gate/up GEMM, then the SiLU-and-mul kernel), ours
in two launches (`linear` at the selection's schedule, then SiLU-and-mul) and ours in one (`gate_up_silu`: SiLU-and-mul
in the projection's epilogue, `kernels/matmul_gated.py`), with the one launch's bits checked against the two's.

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/gated_mlp_probe.py [--model qwen2-0.5b]
        [--commitment bench/tuned/h200_qwen2-0.5b_decode1.json] [--ms 1,8,32,64,256,512] [--max-num-tokens 8192]

The model's gate/up site (loaded as the detent arm with the tuple, without weights) gives the selection; the
weights are random, read from HBM at every call as in a step (`timing.cold_copies`). Times: CUDA-graph replays, µs
a call (`timing.kernel_timer`: on the CPU, the median of plain calls, a smoke test only), our kernels' programmatic
dependent launch off (as cuBLAS runs; one kernel's replays overlapping under PDL flatters a small launch). An M
whose schedule the one launch does not compute (the warpgroup kernel, parallel chunk sums) says so and is skipped.
"""
from __future__ import annotations

import argparse
import os

import torch

from detent_rl.kernels import matmul_gated
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.kernels.matmul import launch_params, linear, stock_linear
from detent_rl.kernels.silu_and_mul import silu_and_mul
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.timing import cold_copies, kernel_timer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", help="a built-in name or an HF checkpoint directory")
    ap.add_argument("--commitment", help="a tuned tuple (its deployment's limits must match the ones given here)")
    ap.add_argument("--ms", default="1,8,32,64,256,512")
    ap.add_argument("--max-context", type=int, default=784)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--max-num-tokens", type=int, default=8192)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    os.environ["DETENT_PDL"] = "0"
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    model = load_model(path, "detent", device="meta", dtype=torch.bfloat16,
                       commitment=CommitmentTuple.load(args.commitment) if args.commitment else None,
                       max_context=args.max_context, max_batch=args.max_batch, max_num_tokens=args.max_num_tokens)
    site = model.model.layers[0].mlp.gate_up_proj
    n, k = site.weight.shape
    g = torch.Generator(device=args.device).manual_seed(0)
    w0 = (torch.randn(n, k, generator=g, device=args.device) / k ** 0.5).to(torch.bfloat16)
    w = cold_copies(w0)
    timer = kernel_timer(torch.device(args.device), 20)
    print(f"{args.model} gate/up {k} -> {n} (d = {n // 2}), bf16, {args.device}; µs a call, PDL off")
    print("| M | schedule | stock: cuBLAS + SiLU-and-mul | ours, two launches | ours, one launch | one / two | "
          "one / stock | bits |")
    print("|---|---|---|---|---|---|---|---|")
    for m in (int(x) for x in args.ms.split(",") if x.strip()):
        x = torch.randn(m, k, generator=g, device=args.device).to(torch.bfloat16)
        launch = launch_params(site._select(m))
        tile = (f"{launch['block_m']}x{launch['block_n']}x{launch['block_k']}, chunk {launch['chunk']}"
                + (", warpgroup" if launch["wgmma"] else "") + (", parallel" if launch["parallel"] else ""))
        stock = timer(lambda: silu_and_mul(stock_linear(x, w()), block=1024)) * 1e6
        two = timer(lambda: silu_and_mul(linear(x, w(), None, **launch), block=1024)) * 1e6
        if not matmul_gated.fusable(launch, k):
            print(f"| {m} | {tile} | {stock:.1f} | {two:.1f} | (not this schedule) | | | |")
            continue
        one = timer(lambda: matmul_gated.gate_up_silu(x, w(), None, block=1024, **launch)) * 1e6
        same = torch.equal(matmul_gated.gate_up_silu(x, w0, None, block=1024, **launch),
                           silu_and_mul(linear(x, w0, None, **launch), block=1024))
        print(f"| {m} | {tile} | {stock:.1f} | {two:.1f} | {one:.1f} | {one / two:.2f}x | {one / stock:.2f}x | "
              f"{'=' if same else 'DIFFER'} |")


if __name__ == "__main__":
    main()
