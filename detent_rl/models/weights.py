"""The identity of a set of weights, computed alike by the trainer and the engine.

`weights_digest` (the weight sync's check): after every update the trainer sends its compute weights
with their digest and the engine recomputes it over what it then holds, so a sync that lost,
reordered or re-rounded anything is caught, by tensor name. It runs where the weights are (the GPU,
no copy to the host) on integer arithmetic, so the GPU, the CPU and any reduction order give the
same value. `weights_sha256` (checkpoints, tests): sha256 over the bytes on the host.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

import torch

from detent_rl.kernels._triton import interpreting
from detent_rl.kernels.digest import lane_sums


def weights_sha256(named: Mapping[str, torch.Tensor] | torch.nn.Module) -> str:
    """sha256 over (name, dtype, shape, sha256 of the bytes) of every weight in name order.

    The tensors' own digests run in threads (hashlib releases the GIL on large buffers), each as soon
    as its bytes are on the host, so a 0.5B model hashes in a fraction of a serial pass."""
    items = dict(named.named_parameters()) if isinstance(named, torch.nn.Module) else named
    names = sorted(items)

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).hexdigest()

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        jobs = {}
        for n in names:
            t = items[n].detach().contiguous().cpu()
            jobs[n] = (t.dtype, tuple(t.shape), pool.submit(digest, t))
    h = hashlib.sha256()
    for n in names:
        dtype, shape, job = jobs[n]
        h.update(f"{n}|{dtype}|{shape}|{job.result()}\n".encode())
    return h.hexdigest()


# ---- the keyed 128-bit digest ---------------------------------------------------------------------
#
# A tensor's bytes are read as little-endian 64-bit words w_1 .. w_n (the last one zero-padded). Each
# of two lanes maps word i to f(w_i, i) = fmix64((w_i ^ k) + i * s) — fmix64 is MurmurHash3's 64-bit
# finaliser, a bijection; k, s (s odd) are the lane's constants, derived from the key — and sums the
# images mod 2^64. The tensor's digest is the two lane sums (128 bits) with its name, dtype and shape.
# A change to one word changes its image (f is a bijection of w for a fixed i), so it changes both sums:
# any one flipped bit, or any damage confined to one word, is caught with certainty; damage to several
# words escapes only if the images' changes cancel in both lanes. Integer sums do not depend on their
# order, so the value is the same on the GPU and the CPU, in chunks or whole.

_M64 = (1 << 64) - 1
_FMIX = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
DEFAULT_KEY = 0x5EED_DE7E_57_2026
CHUNK_WORDS = 1 << 20  # words hashed per pass (8 MB): bounds the temporaries, and on the CPU keeps them in cache (3x)


def _signed(v: int) -> int:
    """`v` mod 2^64 as a signed 64-bit integer (what an int64 tensor holds)."""
    v &= _M64
    return v - (1 << 64) if v >> 63 else v


def _lanes(key: int) -> tuple[tuple[int, int], ...]:
    """Each lane's (xor constant, odd position step), from the key by the same finaliser."""
    def fmix(h: int) -> int:
        h ^= h >> 33
        h = h * _FMIX[0] & _M64
        h ^= h >> 33
        h = h * _FMIX[1] & _M64
        return h ^ (h >> 33)
    return tuple((_signed(fmix(key + 2 * j + 1)), _signed(fmix(key + 2 * j + 2) | 1)) for j in range(2))


def _fmix64_(h: torch.Tensor) -> torch.Tensor:
    """fmix64 of int64 words, in place (returns h). torch's >> is arithmetic: the logical shift by 33 is
    the arithmetic one with the sign's copies masked off. In place and with one scratch tensor: on the
    CPU the allocating form took 6x as long."""
    scratch = torch.empty_like(h)
    for factor in (_signed(_FMIX[0]), _signed(_FMIX[1]), None):
        torch.bitwise_right_shift(h, 33, out=scratch)
        scratch &= (1 << 31) - 1
        h ^= scratch
        if factor is not None:
            h *= factor
    return h


def _words(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as int64 words, the last one zero-padded (the byte count enters the digest too)."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = -b.numel() % 8
    if pad:
        b = torch.cat([b, b.new_zeros(pad)])
    return b.view(torch.int64)


@dataclass(frozen=True)
class WeightsDigest:
    """Per tensor, in name order: (name, "dtype|shape|128-bit hex"); `hex` sums them all up."""
    tensors: tuple[tuple[str, str], ...]
    key: int

    @property
    def hex(self) -> str:
        h = hashlib.sha256(f"key {self.key}\n".encode())
        for name, entry in self.tensors:
            h.update(f"{name}|{entry}\n".encode())
        return h.hexdigest()[:32]

    def differing(self, other: "WeightsDigest") -> list[str]:
        """Names whose entries differ or that one side lacks."""
        a, b = dict(self.tensors), dict(other.tensors)
        return sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))


def weights_digest(named: Mapping[str, torch.Tensor] | torch.nn.Module, key: int = DEFAULT_KEY,
                   method: str | None = None) -> WeightsDigest:
    """The keyed 128-bit digest of every weight (see above), computed on the weights' device, with one
    copy to the host at the end (16 bytes a tensor). `method` "triton" (the default on the GPU): one
    pass over each tensor's words in kernels/digest.py; "torch" (the CPU's): the words of all tensors
    stream through passes of about CHUNK_WORDS words, each lane's images summed by one running sum
    read at the end of each tensor's piece. Both give the same value (integer sums)."""
    if method not in (None, "triton", "torch"):
        raise ValueError(f"weights_digest: method must be 'triton' or 'torch', not {method!r}")
    items = dict(named.named_parameters()) if isinstance(named, torch.nn.Module) else dict(named)
    names = sorted(items)
    if not names:
        return WeightsDigest((), key)
    device = items[names[0]].device
    for n in names:
        if items[n].device != device:
            raise ValueError(f"weights_digest: {n} is on {items[n].device}, the others on {device}")
    lanes = _lanes(key)
    if method is None:
        method = "triton" if device.type == "cuda" else "torch"
    if method == "triton":
        if device.type != "cuda" and not interpreting():
            raise ValueError(f"weights_digest: the triton method needs CUDA tensors (these are on {device})")
        sums = lane_sums([_words(items[n]) for n in names], lanes)  # one pass, kernels/digest.py
    else:
        sums = _lane_sums_torch(items, names, lanes, device)
    lane_sums_host = sums.cpu().tolist()
    entries = []
    for i, n in enumerate(names):
        t = items[n]
        bits = "".join(f"{lane_sums_host[j][i] & _M64:016x}" for j in range(len(lanes)))
        entries.append((n, f"{t.dtype}|{tuple(t.shape)}|{t.numel() * t.element_size()}|{bits}"))
    return WeightsDigest(tuple(entries), key)


def _lane_sums_torch(items: Mapping[str, torch.Tensor], names: list[str], lanes: tuple[tuple[int, int], ...],
                     device: torch.device) -> torch.Tensor:
    """The lane sums [lanes, tensors] by PyTorch element-wise ops (the CPU's path, and the GPU kernel's
    reference)."""
    sums = torch.zeros((len(lanes), len(names)), dtype=torch.int64, device=device)
    pending: list[tuple[int, int, torch.Tensor]] = []  # (tensor index, first word's position, words)

    def flush() -> None:
        if not pending:
            return
        counts = [w.numel() for _, _, w in pending]
        total = sum(counts)
        words = torch.cat([w for _, _, w in pending]) if len(pending) > 1 else pending[0][2]
        starts, at = [], 0
        for (_, first, _), n in zip(pending, counts):
            starts.append(first + 1 - at)  # position (from 1) of this piece's first word, less its offset
            at += n
        pos = torch.arange(total, dtype=torch.int64, device=device)
        pos += torch.repeat_interleave(torch.tensor(starts, device=device), torch.tensor(counts, device=device),
                                       output_size=total)
        ends = torch.tensor(list(itertools.accumulate(counts)), device=device) - 1
        ids = torch.tensor([i for i, _, _ in pending], device=device)
        for lane, (k, step) in enumerate(lanes):
            # each piece's sum from a running sum read at the pieces' ends: a scan, not atomics on one slot
            h = torch.bitwise_xor(words, k)
            h += pos * step
            edges = _fmix64_(h).cumsum(0)[ends]
            sums[lane].index_add_(0, ids, torch.diff(edges, prepend=edges.new_zeros(1)))
        pending.clear()

    buffered = 0
    for i, n in enumerate(names):
        w = _words(items[n])
        for first in range(0, w.numel(), CHUNK_WORDS):
            piece = w[first:first + CHUNK_WORDS]
            pending.append((i, first, piece))
            buffered += piece.numel()
            if buffered >= CHUNK_WORDS:
                flush()
                buffered = 0
    flush()
    return sums
