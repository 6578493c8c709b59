"""The sampler's noise: MurmurHash3_x86_32 of (request seed, position, vocabulary id), and its Gumbel draw.

The hash of the 20-byte message struct.pack("<qqI", seed, position, id), seed 0, in 32-bit unsigned
arithmetic: in Triton (uint32; `mix_word`, `fmix32`, used inside `vocab._partials_kernel`) and in
PyTorch (int64 tensors holding uint32 values; no product exceeds 2**49). The 4 words of (seed,
position) are mixed once per row (`row_state`), then each id. `gumbel` maps a hash to
u = (2 * (h >> 9) + 1) * 2**-24 in (0, 1) and g = -log(-log(u)) in fp32 (why 23 bits: `sampling`).
"""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import tl, triton  # noqa: F401 (jit functions need tl in their globals)

_M32 = 0xFFFFFFFF
_C1, _C2, _F1, _F2, _N = 0xCC9E2D51, 0x1B873593, 0x85EBCA6B, 0xC2B2AE35, 0xE6546B64
MESSAGE_BYTES = 20


@triton.jit
def mix_word(h, k):
    k = k * 0xCC9E2D51
    k = (k << 15) | (k >> 17)
    k = k * 0x1B873593
    h = h ^ k
    h = (h << 13) | (h >> 19)
    return h * 5 + 0xE6546B64


@triton.jit
def fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


# the same hash in PyTorch

def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _rotl32(a: torch.Tensor, r: int) -> torch.Tensor:
    return ((a << r) | (a >> (32 - r))) & _M32


def mix_word_torch(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(_rotl32(_mul32(k, _C1), 15), _C2)
    return (_rotl32(h ^ k, 13) * 5 + _N) & _M32


def fmix32_torch(h: torch.Tensor) -> torch.Tensor:
    h = _mul32(h ^ (h >> 16), _F1)
    h = _mul32(h ^ (h >> 13), _F2)
    return h ^ (h >> 16)


def row_state(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The MurmurHash3 state after the words (seed lo, seed hi, position lo, position hi): [rows]."""
    h = torch.zeros_like(seeds)
    for word in (seeds & _M32, (seeds >> 32) & _M32, positions & _M32, (positions >> 32) & _M32):
        h = mix_word_torch(h, word)
    return h


def message_hash(seeds: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """MurmurHash3_x86_32 of (seed, position, id) for seeds/positions [rows], ids [n]: [rows, n] int64."""
    state = row_state(seeds.long(), positions.long())[:, None]
    return fmix32_torch(mix_word_torch(state, ids.long()[None, :]) ^ MESSAGE_BYTES)


def gumbel(h: torch.Tensor) -> torch.Tensor:
    u = (((h >> 9) << 1) | 1).to(torch.float32) * 2.0 ** -24
    return -torch.log(-torch.log(u))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """fp32 [rows, n]: the Gumbel draw of each (seed, position) row at each vocabulary id."""
    return gumbel(message_hash(seeds, positions, ids))
