"""Shared plumbing of the row-wise kernels: Triton import guard, dispatch, layouts, CPU row folds.

Dispatch is by device: CUDA tensors go to the Triton kernel, CPU tensors to the PyTorch path.
`interpreting()` lets tests run the Triton kernels on CPU tensors under `TRITON_INTERPRET=1`.
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:
    # A CPU-only install still imports the kernel modules (their kernels are never launched).
    triton = SimpleNamespace(jit=lambda fn: fn)
    tl = SimpleNamespace(constexpr=int)
    HAS_TRITON = False

# Triton specializes a pointer argument on 16-byte alignment, and the coalescer derives the load
# layout from it; in a row reduction that layout decides tl.sum's tree. Keep it fixed.
_ALIGN_BYTES = 16

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


# CPython keeps the process environment in `os.environ._data`, encoded: reading a variable from it skips
# `os.environ.get`'s key encoding (~0.7 µs a read on this CPU, several a launch, more on the H200's host). The
# mapping is the one `os.environ` writes through (monkeypatch.setenv included), so a change is seen at once.
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def env(name: str, default: str = "") -> str:
    """`os.environ.get(name, default)` for the variables read on every launch."""
    if _ENV_DATA is None:
        return os.environ.get(name, default)
    value = _ENV_DATA.get(name.encode())
    return default if value is None else os.fsdecode(value)


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1), for tests only."""
    return env("TRITON_INTERPRET", "0") not in ("", "0")


_PDL_DEVICES: dict[int, bool] = {}


def pdl(t: torch.Tensor) -> dict:
    """Launch options for programmatic dependent launch (PDL) of a kernel on `t`'s device.

    On Hopper and later a kernel launched with PDL may be scheduled while its predecessor in the
    stream drains (captured graphs keep it as a programmatic edge), which hides most of the launch
    gap between two short kernels. Every kernel of ours takes a `PDL` constexpr and calls
    `pdl_enter(PDL)`: it waits for its predecessor's completion and memory (griddepcontrol.wait)
    before it writes anything or reads anything a kernel of the step may have written, so nothing
    races, and lets its own successor be scheduled at once. Before the wait a kernel reads only what
    was in memory before its predecessor started: host-fed inputs (a step's uploaded metadata:
    positions, slots, block tables, query offsets and tiles, whose writers are copies or kernels at
    least two launches back, complete before the predecessor passed its own wait) and tables fixed at
    load (the rope table). The attention, its combine and the rotary store read those so, and their
    chains of dependent loads then run while the predecessor does. It moves when a load is issued,
    never what it loads or computes: bit-neutral.
    Off on the CPU, under the interpreter, before sm_90, and with DETENT_PDL=0 (A/B measurements).
    Returns the kernel's keyword arguments: `PDL` and, when on, Triton's `launch_pdl`.
    """
    on = False
    if t.is_cuda and HAS_TRITON and not interpreting() and env("DETENT_PDL", "1") != "0":
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        if index not in _PDL_DEVICES:
            _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
        on = _PDL_DEVICES[index]
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Before a kernel's first write and first read of the step's memory (see `pdl`): wait for the
    predecessor, release the successor."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def use_triton(t: torch.Tensor) -> bool:
    """CUDA tensors take the Triton path; CPU tensors the PyTorch path."""
    if t.is_cuda:
        if not HAS_TRITON:
            raise RuntimeError("a CUDA tensor was passed but Triton is not installed")
        return True
    return False


def require_triton(t: torch.Tensor) -> None:
    """The Triton launchers run on CUDA, or on CPU tensors under the interpreter."""
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed")
    if not (t.is_cuda or interpreting()):
        raise RuntimeError("Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 on CPU)")


def check_block(block: int) -> None:
    if not (isinstance(block, int) and block >= 16 and block & (block - 1) == 0):
        raise ValueError(f"block must be a power of two >= 16, got {block!r}")


def dense_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as densely packed rows ([rows, n] with stride (n, 1)) on a 16-byte-aligned base.

    A row reduction's compiled variant (and so its bits) must not depend on whether the caller
    passed a view (a slice of a larger batch, the last position of [B, T, V] logits): such inputs
    are copied, so every call sees the same strides and alignment for the same row width.
    """
    assert t.dim() == 2, f"expected [rows, n], got shape {tuple(t.shape)}"
    rows, n = t.shape
    packed = t.stride(1) == 1 and (rows <= 1 or t.stride(0) == n)
    if packed and t.data_ptr() % _ALIGN_BYTES == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous on a 16-byte-aligned base (a copy only when it is not)."""
    if t.is_contiguous() and t.data_ptr() % _ALIGN_BYTES == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def fold_rows(x: torch.Tensor, block: int, fill: float, chunk: Callable[[torch.Tensor], torch.Tensor],
              combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], identity: float) -> torch.Tensor:
    """The CPU mirror of the kernels' row reduction: [rows, n] -> [rows] fp32.

    An accumulator vector of `block` lanes starts at `identity`; the row is walked in chunks of
    `block` (the tail padded with `fill`), each chunk mapped by `chunk` and combined lane-wise into
    the vector; then the vector is folded in halves. Every step is an elementwise op whose
    operands have `block` lanes per row, so the association depends only on `block` and the row,
    never on the row count or the row's position (torch's own CPU reductions split work by thread
    and vector width, which may depend on them).
    """
    rows, n = x.shape
    acc = torch.full((rows, block), identity, dtype=torch.float32, device=x.device)
    for start in range(0, n, block):
        part = x[:, start:start + block]
        if part.shape[1] < block:
            part = F.pad(part, (0, block - part.shape[1]), value=fill)
        acc = combine(acc, chunk(part))
    width = block
    while width > 1:
        width //= 2
        acc = combine(acc[:, :width], acc[:, width:])
    return acc[:, 0]
