"""Our Triton linear vs cuBLAS, per linear site of the Qwen2 0.5B and 1.5B configs, side by side in one run.

Command: python bench/kernels_matmul_bench.py [--models 0.5b,1.5b] [--ms 1,8,32,128,512,2048,8192]
Prints a markdown table: per site and M, the median time under CUDA-graph replay
(triton.testing.do_bench_cudagraph: kernel time without Python launch overhead; the weights rotate
through copies, `timing.cold_copies`, so each call reads them from HBM as a step does) of
  - cuBLAS: torch.nn.functional.linear (what the stock arm runs),
  - detent default: the default tuple's K partition, the schedule following M,
  - detent best: the fastest legal K partition for this M (what the tuner can commit for a workload
    made of this M alone),
  - det: K in one piece and one schedule for every M (the deterministic-mode arm),
  - stock selection: our kernel under the stock selection (split-K for decode; not invariant),
each but cuBLAS as a ratio to cuBLAS.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton

from detent_rl.kernels.matmul import launch_params, linear
from detent_rl.kernels.selections import Deployment, KernelSelections
from detent_rl.timing import cold_copies

MODELS = {  # deployment, and the sites (name, n, k, bias)
    "0.5b": (Deployment(num_heads=14, num_kv_heads=2, head_dim=64, hidden=896, vocab=151936),
             [("qkv", 1152, 896, True), ("o", 896, 896, False), ("gate_up", 9728, 896, False),
              ("down", 896, 4864, False), ("lm_head", 151936, 896, False)]),
    "1.5b": (Deployment(num_heads=12, num_kv_heads=2, head_dim=128, hidden=1536, vocab=151936),
             [("qkv", 2048, 1536, True), ("o", 1536, 1536, False), ("gate_up", 17920, 1536, False),
              ("down", 1536, 8960, False), ("lm_head", 151936, 1536, False)]),
}


def timed(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument("--ms", default="1,8,32,128,512,2048,8192")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    print(f"# GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, bf16; "
          f"us per call")
    print("| model | site | M | cuBLAS us | detent default | detent best (chunk) | det | stock selection |")
    print("|---|---|---|---|---|---|---|---|")
    g = torch.Generator(device="cuda").manual_seed(0)
    for model in args.models.split(","):
        deployment, sites = MODELS[model]
        detent, det, stock = (KernelSelections(deployment, arm) for arm in ("detent", "det", "stock"))
        for name, n, k, bias in sites:
            sol = detent.solution("matmul", n=n, k=k)
            chunks = sorted({dict(zip(sol.axes, a)).get("chunk") for a in sol.legal})
            pinned = {c: sol.commit({"chunk": c} if c is not None else {}, {"schedule_by_m": True}) for c in chunks}
            w = cold_copies((torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16))
            b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if bias else None
            big = torch.randn(max(ms), k, generator=g, device="cuda").to(torch.bfloat16)
            arms = [detent.get("matmul", n=n, k=k), det.get("matmul", n=n, k=k), stock.get("matmul", n=n, k=k)]
            for m in ms:
                x = big[:m]
                cublas = timed(lambda: F.linear(x, w(), b))
                ours = [timed(lambda s=s: linear(x, w(), b, **launch_params(s(m)))) for s in arms]
                best = min((timed(lambda s=s: linear(x, w(), b, **launch_params(s(m)))), c) for c, s in pinned.items())
                print(f"| {model} | {name} {k}->{n} | {m} | {cublas:.1f} | {ours[0] / cublas:.2f}x "
                      f"(chunk {arms[0](m).chunk}) | {best[0] / cublas:.2f}x ({best[1]}) | {ours[1] / cublas:.2f}x | "
                      f"{ours[2] / cublas:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
