"""The tensor-parallel all-reduce: each algorithm of the `allreduce` selection program, over torch.distributed.

Every algorithm but "nccl" sums an element's rank contributions in an order it fixes itself, in fp32,
rounding once to the input's dtype:

- one_shot_push: every rank gathers every rank's whole message and sums it in rank order 0, 1, ..., W-1.
- two_shot_push / two_shot_pull: the message is cut into W chunks; rank j reduces chunk j (its peers'
  pieces reach it by an all-to-all), starting from its own piece: j, j+1, ..., j-1 (mod W), the
  rotated peer order of custom all-reduce kernels; then the reduced chunks are gathered. Push and pull
  differ on the GPU in how data moves, not in this order, so they give the same bits here.
- nccl: the process group's own all-reduce (NCCL on the GPU, gloo on the CPU), whose order follows its
  chunking of the message: from three ranks up a row's bits change with the message size
  (tests/test_tensor_parallel.py shows it for gloo in bf16).

So one-shot and two-shot round differently from three ranks up, and each is batch-invariant only if
it is the algorithm for every message: the program's pin. At two ranks every algorithm adds two
values once, so all agree. The data moves through the group's all-gather and all-to-all; the sums
are a host-side loop over W parts (a kernel on the GPU would fuse them: not written yet).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

ALGORITHMS = ("one_shot_push", "two_shot_push", "two_shot_pull", "nccl")


def ordered_sum(parts: list[torch.Tensor], order: list[int], dtype: torch.dtype) -> torch.Tensor:
    """parts[order[0]] + parts[order[1]] + ... in fp32, left to right, rounded once to `dtype`."""
    acc = parts[order[0]].to(torch.float32, copy=True)
    for i in order[1:]:
        acc += parts[i].to(torch.float32)
    return acc.to(dtype)


def all_gather(x: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> list[torch.Tensor]:
    """Every rank's `x` (same shape on all), in rank order; exact."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


def all_reduce(x: torch.Tensor, algorithm: str, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """The sum of `x` over the group's ranks, by `algorithm` (one of ALGORITHMS); a new tensor of x's
    shape and dtype. Every rank must call it with the same algorithm and shape."""
    world = dist.get_world_size(group)
    if world == 1:
        return x
    if algorithm == "nccl":
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out
    flat = x.contiguous().view(-1)
    if algorithm == "one_shot_push":
        return ordered_sum(all_gather(flat, group), list(range(world)), x.dtype).view(x.shape)
    if algorithm not in ("two_shot_push", "two_shot_pull"):
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; known: {ALGORITHMS}")
    rank = dist.get_rank(group)
    n = flat.numel()
    chunk = -(-n // world)
    padded = torch.zeros(chunk * world, dtype=x.dtype, device=x.device)
    padded[:n] = flat
    pieces = torch.empty_like(padded)  # pieces[i * chunk:(i + 1) * chunk]: rank i's piece of my chunk
    dist.all_to_all_single(pieces, padded, group=group)
    mine = ordered_sum(list(pieces.view(world, chunk)), [(rank + i) % world for i in range(world)], x.dtype)
    return torch.cat(all_gather(mine, group))[:n].view(x.shape)


def all_reduce_reference(parts: list[torch.Tensor], algorithm: str) -> torch.Tensor:
    """What `all_reduce` returns, from every rank's input in one process (the order each algorithm fixes);
    for tests. Not defined for "nccl" (its order is the backend's)."""
    world, dtype, shape = len(parts), parts[0].dtype, parts[0].shape
    if algorithm == "one_shot_push":
        return ordered_sum(parts, list(range(world)), dtype)
    flat = [p.reshape(-1) for p in parts]
    n = flat[0].numel()
    chunk = -(-n // world)
    out = []
    for j in range(world):
        lo, hi = min(j * chunk, n), min((j + 1) * chunk, n)
        out.append(ordered_sum([f[lo:hi] for f in flat], [(j + i) % world for i in range(world)], dtype))
    return torch.cat(out).view(shape)
