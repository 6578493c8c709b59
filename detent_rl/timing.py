"""Timing for the tuner and the benchmark: the same clock on the CPU and the GPU.

`median_seconds` times whole host-side calls (an engine step, a workload), synchronising the device
around each; `graph_seconds` times a kernel launch as a CUDA-graph replay sees it (no launch
overhead); `kernel_timer` picks the second on the GPU and the first on the CPU. `cold_copies` rotates
an operand through copies, so that a kernel timed by repeated launches reads it from memory, not
from the L2 cache.
"""
from __future__ import annotations

import gc
import itertools
import statistics
import time
from typing import Any, Callable, Optional

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


COLD_BYTES = 256 << 20  # five times a Hopper GPU's L2 cache (50 MB on the H100 and H200)


def cold_copies(t: torch.Tensor, nbytes: Optional[int] = None) -> Callable[[], torch.Tensor]:
    """A function that returns `t` and its copies in turn, enough copies that one round reads at least
    `nbytes`. A decode step reads each layer's weights once, from HBM; a kernel launched again and
    again on one weight matrix of a few MB reads it from L2 instead, which flatters a memory-bound
    schedule and misleads a choice between schedules. Graph timing (`graph_seconds`) captures its
    repeated calls, so the thunk `lambda: kernel(x, next_w())` captures them over the copies in turn.
    `nbytes` defaults to COLD_BYTES on a GPU and to 0 (no copies) on the CPU."""
    if nbytes is None:
        nbytes = COLD_BYTES if t.is_cuda else 0
    copies = [t] + [t.clone() for _ in range(max(1, -(-nbytes // max(1, t.numel() * t.element_size()))) - 1)]
    rotation = itertools.cycle(copies)
    return lambda: next(rotation)


class GcPauses:
    """The garbage collector's passes while open (a context manager): `full` (oldest-generation passes, which walk
    every tracked object: ~0.1 s with torch, transformers and Triton loaded on the 2-core CI machine) and `ms`, the
    time in all passes so far. A pass inside a timed step is host time the step holds: an online serve reads `ms`
    around each step to tell a collector's stall from a kernel's."""

    def __init__(self) -> None:
        self.full, self.ms, self._t0 = 0, 0.0, 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.ms += 1e3 * (time.perf_counter() - self._t0)
        self.full += info["generation"] == 2

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)
