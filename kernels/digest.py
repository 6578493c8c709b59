"""The weight digest's hashing pass on the GPU (`models.weights.weights_digest` defines the value).

Each of a tensor's 64-bit words w_i (i from 1) goes to fmix64((w_i ^ k) + i * s) per lane, and each
program sums its words' images mod 2^64 into one partial; the partials of a tensor are then added (an
integer sum: any order gives the same value). One pass over the bytes, all in registers — the
PyTorch form of the same arithmetic (the CPU's, and the reference) spends some forty full-size
element-wise passes and the host's time launching them.
"""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import pdl, pdl_enter, tl, triton
from detent_rl.kernels.launch import launch

WORDS_PER_PROGRAM = 8192  # 64 KB of a tensor per program: BLOCK words, ITERS times
BLOCK = 1024


@triton.jit
def _fmix64(h):
    h ^= h >> 33
    h *= 0xFF51AFD7ED558CCD
    h ^= h >> 33
    h *= 0xC4CEB9FE1A85EC53
    return h ^ (h >> 33)


@triton.jit
def _digest_kernel(words_ptr, n_words, consts_ptr, partial_ptr, stride_lane, first_program,
                   BLOCK: tl.constexpr, ITERS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    k0 = tl.load(consts_ptr + 0).to(tl.uint64, bitcast=True)
    s0 = tl.load(consts_ptr + 1).to(tl.uint64, bitcast=True)
    k1 = tl.load(consts_ptr + 2).to(tl.uint64, bitcast=True)
    s1 = tl.load(consts_ptr + 3).to(tl.uint64, bitcast=True)
    acc0 = tl.zeros((BLOCK,), dtype=tl.uint64)
    acc1 = tl.zeros((BLOCK,), dtype=tl.uint64)
    for it in range(ITERS):
        offs = (pid * ITERS + it).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_words
        w = tl.load(words_ptr + offs, mask=mask, other=0).to(tl.uint64, bitcast=True)
        pos = (offs + 1).to(tl.uint64)
        acc0 += tl.where(mask, _fmix64((w ^ k0) + pos * s0), 0)
        acc1 += tl.where(mask, _fmix64((w ^ k1) + pos * s1), 0)
    out = first_program + pid
    tl.store(partial_ptr + out, tl.sum(acc0, axis=0).to(tl.int64, bitcast=True))
    tl.store(partial_ptr + stride_lane + out, tl.sum(acc1, axis=0).to(tl.int64, bitcast=True))


def lane_sums(words: list[torch.Tensor], lanes: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """[2, len(words)] int64: each lane's sum of its images of each tensor's words (int64 tensors, all
    on one CUDA device), as `models.weights` defines it. One launch per tensor into one buffer of
    partials, then one integer reduction per lane."""
    assert len(lanes) == 2, "the kernel computes two lanes"
    device = words[0].device
    programs = [triton.cdiv(w.numel(), WORDS_PER_PROGRAM) for w in words]
    total = sum(programs)
    partial = torch.empty((2, total), dtype=torch.int64, device=device)
    consts = torch.tensor([c for lane in lanes for c in lane], dtype=torch.int64).to(device, non_blocking=True)
    at = 0
    for w, n in zip(words, programs):
        if n:
            launch(_digest_kernel, (n,), w, w.numel(), consts, partial, total, at, BLOCK=BLOCK,
                   ITERS=WORDS_PER_PROGRAM // BLOCK, **pdl(w))
        at += n
    owner = torch.repeat_interleave(torch.arange(len(words)), torch.tensor(programs)).to(device, non_blocking=True)
    sums = torch.zeros((2, len(words)), dtype=torch.int64, device=device)
    return sums.index_add_(1, owner, partial)
