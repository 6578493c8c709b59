"""Which PyTorch attention backward the trainer can use: time and run-to-run bits of causal SDPA's
forward + backward, per kernel, with and without PyTorch's deterministic algorithms.

    python3 bench/sdpa_backward_probe.py [--shapes 4x2304,1x8448] [--heads 12] [--head-dim 128]

The trainer differentiates attention with SDPA over padded batches (`kernels.autograd._sdpa`); its
backward must be deterministic (the trainer's runs and resumes repeat bit for bit). For each shape
(batch x tokens, bf16): median ms of forward + backward over 5 runs after a warm-up, and whether the five
runs' gradients are bit-equal. A kernel whose repeat differs is not deterministic; one whose repeat
matches may still be, or may have been lucky (atomics need not reorder every time).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.deterministic
from torch.nn.attention import SDPBackend, sdpa_kernel


def probe(backend: SDPBackend, deterministic: bool, batch: int, tokens: int, heads: int, head_dim: int
          ) -> tuple[float, bool]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, generator=g, device="cuda", dtype=torch.bfloat16)
               .requires_grad_(True) for _ in range(3))
    up = torch.randn(batch, heads, tokens, head_dim, generator=g, device="cuda", dtype=torch.bfloat16)
    before, fill = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = False
    runs = []
    try:
        for _ in range(6):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grads = torch.autograd.grad(o, (q, k, v), up)
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t, grads))
    finally:
        torch.use_deterministic_algorithms(before)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    same = all(torch.equal(a, b) for run in runs[2:] for a, b in zip(runs[1][1], run[1]))
    return statistics.median(t for t, _ in runs[1:]) * 1e3, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4x2304,1x8448", help="batch x tokens, comma-separated")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, causal, {args.heads} heads of "
          f"{args.head_dim}")
    print("| batch x tokens | kernel | deterministic algorithms | fwd + bwd ms | five runs bit-equal |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        batch, tokens = (int(x) for x in shape.split("x"))
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION),
                              ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            for det in (True, False):
                try:
                    ms, same = probe(backend, det, batch, tokens, args.heads, args.head_dim)
                    print(f"| {shape} | {name} | {'on' if det else 'off'} | {ms:.2f} | {same} |", flush=True)
                except RuntimeError as e:
                    print(f"| {shape} | {name} | {'on' if det else 'off'} | {type(e).__name__}: {str(e)[:80]} | |")


if __name__ == "__main__":
    main()
