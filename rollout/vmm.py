"""Device memory whose physical pages can be given back while its addresses stay reserved (CUDA's virtual memory
management, through the driver API).

A colocated run frees the engines' KV cache while the trainer updates (`Engine.release_memory`). Freed through
PyTorch's caching allocator, the cache comes back at other addresses, and every captured graph that reads or writes
it (the decode graphs, the step pieces) has to be dropped and captured again in the next rollout. Here the cache is
a reserved virtual range with physical memory mapped into it (cuMemAddressReserve, cuMemCreate, cuMemMap: what
vLLM's sleep mode and SGLang's torch_memory_saver do behind their allocators): `release` unmaps the range and frees
the physical memory (cuMemUnmap, cuMemRelease), `restore` maps new physical memory at the same addresses, and the
graphs stay valid. What the range held is gone after a release: the engine zeroes it on restore.

`available()` says whether the driver is there (not on a machine without CUDA); `ReleasableMemory` raises
RuntimeError naming the driver call and its error where the driver refuses.
"""
from __future__ import annotations

import ctypes
import functools
import weakref
from typing import Optional

import torch

_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED: device memory, resident
_ACCESS_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM


class _Location(ctypes.Structure):  # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):  # CUmemAllocationProp's allocFlags
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_U64, _SIZE, _P = ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER
_SIGNATURES = {
    "cuMemGetAllocationGranularity": (_P(_SIZE), _P(_Prop), ctypes.c_int),
    "cuMemAddressReserve": (_P(_U64), _SIZE, _SIZE, _U64, _U64),
    "cuMemAddressFree": (_U64, _SIZE),
    "cuMemCreate": (_P(_U64), _SIZE, _P(_Prop), _U64),
    "cuMemRelease": (_U64,),
    "cuMemMap": (_U64, _SIZE, _SIZE, _U64, _U64),
    "cuMemUnmap": (_U64, _SIZE),
    "cuMemSetAccess": (_U64, _SIZE, _P(_Access), _SIZE),
    "cuGetErrorName": (ctypes.c_int, _P(ctypes.c_char_p)),
}


@functools.lru_cache(maxsize=1)
def _driver() -> Optional[ctypes.CDLL]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = list(args), ctypes.c_int
    return lib


def available() -> bool:
    """Whether CUDA's driver (with its virtual memory calls) and a CUDA device are here."""
    return torch.cuda.is_available() and _driver() is not None


def _check(rc: int, call: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: CUDA driver error {rc} ({(name.value or b'?').decode()})")


class _Range:
    """A reserved virtual range and the physical allocation mapped into it, if any (`handle[0]`): unmapped,
    released and unreserved when the last tensor over it and its `ReleasableMemory` are gone (no reference cycle
    holds it, so that happens when the engine goes)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes, self.handle = ptr, nbytes, [None]
        weakref.finalize(self, _free, ptr, nbytes, self.handle)

    @property
    def __cuda_array_interface__(self) -> dict:  # the range as bytes, for `torch.as_tensor` (which keeps this alive)
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "strides": None}


def _free(ptr: int, nbytes: int, handle: list) -> None:
    """The finalizer: unmap, release and unreserve."""
    lib = _driver()
    if handle[0] is not None:
        lib.cuMemUnmap(ptr, nbytes)
        lib.cuMemRelease(handle[0])
    lib.cuMemAddressFree(ptr, nbytes)


class ReleasableMemory:
    """`nbytes` (rounded up to the driver's granularity, 2 MiB on Hopper) of memory on `device` at a reserved
    virtual range, mapped: `tensor` is a uint8 tensor over it. `release()` gives the physical memory back (the
    addresses stay reserved, nothing may touch them); `restore()` maps new physical memory there (contents
    undefined)."""

    def __init__(self, nbytes: int, device: torch.device | str) -> None:
        device = torch.device(device)
        if device.type != "cuda" or not available():
            raise RuntimeError(f"releasable memory needs a CUDA device and its driver; got {device}")
        torch.cuda.init()
        torch.empty(0, device=device)  # the device's primary context, current on this thread
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        lib = _driver()
        self._prop = _Prop(type=_ALLOCATION_PINNED, location=_Location(type=_LOCATION_DEVICE, id=index))
        self._access = _Access(location=_Location(type=_LOCATION_DEVICE, id=index), flags=_ACCESS_READ_WRITE)
        grain = _SIZE()
        _check(lib.cuMemGetAllocationGranularity(ctypes.byref(grain), ctypes.byref(self._prop),
                                                 _GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
        self.nbytes = -(-max(nbytes, 1) // grain.value) * grain.value
        ptr = _U64()
        _check(lib.cuMemAddressReserve(ctypes.byref(ptr), self.nbytes, grain.value, 0, 0), "cuMemAddressReserve")
        self.ptr = ptr.value
        self._range = _Range(self.ptr, self.nbytes)
        self._handle = self._range.handle  # the mapped physical allocation, shared with the finalizer
        self.restore()
        self.tensor = torch.as_tensor(self._range, device=self.device)

    @property
    def mapped(self) -> bool:
        return self._handle[0] is not None

    def release(self) -> int:
        """Free the physical memory (after the device's queued work); the bytes freed (0 if already free)."""
        if not self.mapped:
            return 0
        torch.cuda.synchronize(self.device)  # nothing queued may still touch the range
        lib = _driver()
        _check(lib.cuMemUnmap(self.ptr, self.nbytes), "cuMemUnmap")
        _check(lib.cuMemRelease(self._handle[0]), "cuMemRelease")
        self._handle[0] = None
        return self.nbytes

    def restore(self) -> None:
        """Map new physical memory at the range (a no-op while mapped)."""
        if self.mapped:
            return
        lib = _driver()
        handle = _U64()
        _check(lib.cuMemCreate(ctypes.byref(handle), self.nbytes, ctypes.byref(self._prop), 0), "cuMemCreate")
        rc = lib.cuMemMap(self.ptr, self.nbytes, 0, handle.value, 0)
        if rc != 0:
            lib.cuMemRelease(handle.value)
            _check(rc, "cuMemMap")
        self._handle[0] = handle.value
        _check(lib.cuMemSetAccess(self.ptr, self.nbytes, ctypes.byref(self._access), 1), "cuMemSetAccess")
