"""Where a run's device time goes, by kernel: the torch profiler's events summed per (shortened) kernel name.

`short` keeps a Triton kernel's function name and a cuBLAS/CUTLASS kernel's family; `kernel_times` profiles a
callable and returns {kernel: (launches, µs)}: on CUDA each kernel's exclusive device time (CUPTI reports each kernel
a graph replay launches; `exclusive_times`), elsewhere each top-level operator's CPU time (the CPU has no kernels of
its own to report).

Under programmatic dependent launch (PDL) a kernel's span opens while its predecessor still runs: its programs sit
resident, waiting for the predecessor's results. Summed as they are, the spans counted that wait twice, once in each
kernel (session 39: a 1.5B serve step's kernels summed to 9.7 ms under PDL and 5.4 ms without, the SiLU-and-mul's
span 7x its own time). A kernel's exclusive time is the part of its span after every earlier span has closed: the
kernels' times then add up to the time the device was busy (the spans' union), and the wait is its predecessor's.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable

import torch

from detent_rl.timing import sync


def short(name: str) -> str:
    if "gemm" in name.lower() or "cutlass" in name or "sm90" in name:
        m = re.search(r"(sm\d+_xmma_gemm|cutlass\w*?gemm|gemv\w*|splitKreduce\w*|\w*gemm\w*)", name)
        return ("cuBLAS " + m.group(1))[:60] if m else name[:60]
    return name.split("(")[0][:60]


def kernel_times(fn: Callable[[], object], device: torch.device) -> dict[str, tuple[int, float]]:
    """Run `fn` once under the torch profiler (then sync the device): {kernel: (launches, µs)}, costliest first."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as p:
        fn()
        sync(device)
    if cuda:
        return exclusive_times([(e.time_range.start, e.time_range.end, short(e.name)) for e in p.events()
                                if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0])
    per: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if e.cpu_parent is not None or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        k = per[short(e.name)]
        k[0] += 1
        k[1] += e.cpu_time_total
    return _costliest(per)


def exclusive_times(spans: list[tuple[float, float, str]]) -> dict[str, tuple[int, float]]:
    """{kernel: (launches, µs)} from device spans (start, end, kernel) in µs: each span counts only its time after
    every span that opened before it has closed, so the kernels' times add up to the spans' union."""
    per: dict[str, list] = defaultdict(lambda: [0, 0.0])
    closed = float("-inf")  # the latest end of the spans so far
    for start, end, name in sorted(spans):
        k = per[name]
        k[0] += 1
        k[1] += max(0.0, end - max(start, closed))
        closed = max(closed, end)
    return _costliest(per)


def _costliest(per: dict[str, list]) -> dict[str, tuple[int, float]]:
    return {name: (n, us) for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1])}
