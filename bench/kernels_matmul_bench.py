"""Our Triton linear (pinned tile) vs cuBLAS (torch.matmul), side by side in one run on the GPU.

Command: python bench/kernels_matmul_bench.py
Prints a markdown table: per shape and M, the median time under CUDA-graph replay
(triton.testing.do_bench_cudagraph: kernel time without Python launch overhead) of
  - stock: our kernel with the stock selection for this M (split-K below 32 rows),
  - detent default: the pinned default tuple (one tile for every M),
  - detent best: the fastest legal tuple for this M (what the per-workload tuner can reach),
  - cuBLAS: torch.matmul,
and each as a ratio to cuBLAS.
"""
from __future__ import annotations

import torch
import triton

from detent_rl.kernels.matmul import linear, tile_params
from detent_rl.kernels.programs.matmul import matmul_program
from detent_rl.kernels.selections import Deployment
from detent_rl.selir.cache import JITCache
from detent_rl.selir.solver import solve

SHAPES = {"qkv 896->1152": (1152, 896), "gate_up 896->9728": (9728, 896), "down 4864->896": (896, 4864),
          "lm_head 896->151936": (151936, 896)}
ROWS = (1, 8, 32, 128, 512, 2048)
QWEN2_05B = Deployment(num_heads=14, num_kv_heads=2, head_dim=64, hidden=896, vocab=151936)


def main() -> None:
    print(f"# GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape | M | cuBLAS us | stock | detent default | detent best (tile m,n,k,split) |")
    print("|---|---|---|---|---|---|")
    for label, (n, k) in SHAPES.items():
        sol = solve(matmul_program, QWEN2_05B.facts("matmul", {"n": n, "k": k}), cache=JITCache(enabled=False))
        stock, default = sol.stock(), sol.commit()
        tuples = [sol.commit(*sol.split(a)) for a in sol.legal if dict(zip(sol.axes, a))["pad_m"] == 1]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cublas = triton.testing.do_bench_cudagraph(lambda: x @ w.t(), rep=100)
            t_stock = _time(x, w, stock(m))
            t_default = _time(x, w, default(m))
            best = min((_time(x, w, t(m)), _tile(t(m))) for t in tuples)
            print(f"| {label} | {m} | {cublas * 1e3:.1f} | {t_stock / cublas:.2f}x | {t_default / cublas:.2f}x "
                  f"| {best[0] / cublas:.2f}x ({best[1]}) |")


def _tile(cfg) -> str:
    kw = tile_params(cfg)
    return f"{kw['block_m']},{kw['block_n']},{kw['block_k']},{kw['split_k']}"


def _time(x, w, cfg) -> float:
    kw = tile_params(cfg)
    return triton.testing.do_bench_cudagraph(lambda: linear(x, w, **kw), rep=100)


if __name__ == "__main__":
    main()
