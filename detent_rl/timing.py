"""Timing for the tuner and the benchmark: the same clock on the CPU and the GPU.

`median_seconds` times whole host-side calls (an engine step, a workload), synchronising the device
around each; `graph_seconds` times a kernel launch as a CUDA-graph replay sees it (no launch
overhead); `kernel_timer` picks the second on the GPU and the first on the CPU.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median wall time of `repeats` calls after one warm-up call (Triton compiles, graph captures)."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def graph_seconds(fn: Callable[[], Any]) -> float:
    """Seconds per call of `fn` replayed from a CUDA graph (triton.testing.do_bench_cudagraph)."""
    import triton.testing
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e-3


def kernel_timer(device: torch.device, repeats: int) -> Callable[[Callable[[], Any]], float]:
    """Seconds per call of a kernel thunk: CUDA-graph replays on the GPU (as a graph-replayed step
    sees it), the median of `repeats` calls on the CPU."""
    if device.type == "cuda":
        return graph_seconds
    return lambda fn: median_seconds(fn, device, repeats)
