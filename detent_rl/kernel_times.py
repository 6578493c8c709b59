"""Where a run's device time goes, by kernel: the torch profiler's events summed per (shortened) kernel name.

`short` keeps a Triton kernel's function name and a cuBLAS/CUTLASS kernel's family; `kernel_times` profiles a
callable and returns {kernel: (launches, µs)}: on CUDA each kernel's device time (CUPTI reports each kernel a graph
replay launches), elsewhere each top-level operator's CPU time (the CPU has no kernels of its own to report).
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
    per: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if cuda:
            if e.device_type != torch.autograd.DeviceType.CUDA or e.device_time <= 0:
                continue
            us = e.device_time
        else:
            if e.cpu_parent is not None or e.device_type != torch.autograd.DeviceType.CPU:
                continue
            us = e.cpu_time_total
        k = per[short(e.name)]
        k[0] += 1
        k[1] += us
    return {name: (n, us) for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1])}
