"""Tensor parallelism: the model's weights cut over the ranks of a torch.distributed group (Megatron's split).

Attention heads (q and k/v alike), the MLP's intermediate width and the vocabulary are cut into
`size` equal parts; rank r holds part r of each. The q/k/v and gate/up projections and the LM head
are column-parallel (their output rows are cut; the input is every rank's whole row), o_proj and
down_proj are row-parallel (their input columns are cut; each rank's partial output is summed over
the ranks), the embedding is vocabulary-parallel (a rank looks up the ids in its range, zeros
elsewhere, and the rows are summed: one rank's value plus zeros, exact). The LM head's logits are
gathered (exact) so that every rank samples and scores from the whole row with the same kernels as
one GPU; the engine's ranks therefore sample the same tokens and keep their schedulers in step
without a broadcast.

Every sum over ranks goes through `kernels.allreduce.all_reduce` with the algorithm the `allreduce`
selection site picks for the message (`selections.get("allreduce")`, called with its size in bytes
and whether a CUDA graph is being captured): pinned in the detent and det arms, by message size in
the stock arm. Row-parallel partials are rounded to the model dtype before the sum (as the
all-reduce of Megatron, SGLang and vLLM carries them), so a TP run's bits differ from one GPU's;
within one TP degree every token's bits are the same whatever the batch (tests/test_tensor_parallel.py).
`TensorParallel.invariant` instead keeps the partials in fp32 and adds them in rank order — the
one-GPU linear's own chunk fold — so that with matching K partitions (`models/tp_invariant.py`) the
bits are one GPU's.

In the backward: the gradient of a column-parallel layer's input is summed over the ranks (the same
pinned all-reduce), a row-parallel output's gradient is every rank's already, and the gathered
logits hand each rank its own columns' gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from detent_rl.kernels.allreduce import all_gather, all_reduce


@dataclass(frozen=True, eq=False)
class TensorParallel:
    """This process's place in a tensor-parallel group: rank `rank` of `size` (group None: the default one).

    `invariant`: the row-parallel sums are the one-GPU linear's own chunk fold — each rank's partial
    kept in fp32 (one K chunk per rank), the partials added in rank order, the bias, one rounding —
    so with K partitions committed to match (`tp_invariant_commitments`) the model's bits equal one
    GPU's: a TP trainer rescores a one-GPU rollout, or the other way round. Its messages are fp32
    (twice the bytes), summed in rank order whatever the all-reduce site selects."""
    rank: int
    size: int
    group: Optional[dist.ProcessGroup] = None
    invariant: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} outside 0..{self.size - 1}")

    @classmethod
    def from_group(cls, group: Optional[dist.ProcessGroup] = None, invariant: bool = False) -> "TensorParallel":
        """This process's rank in `group` (torch.distributed's default group when None)."""
        if not dist.is_initialized():
            raise RuntimeError("tensor parallelism needs torch.distributed initialised (init_process_group)")
        return cls(dist.get_rank(group), dist.get_world_size(group), group, invariant)

    def part(self, n: int, what: str) -> int:
        """n / size: one rank's share of `what`, which must divide evenly."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) does not divide over {self.size} tensor-parallel ranks")
        return n // self.size

    def span(self, n: int) -> tuple[int, int]:
        """(start, length) of this rank's part of n."""
        length = n // self.size
        return self.rank * length, length


def shard(param: torch.nn.Parameter, tp: TensorParallel, dim: int) -> None:
    """Mark `param` as this rank's part of a tensor cut along `dim` (`param.tp_dim`; the trainer's
    gradient norm sums such parts over the ranks), loaded by `shard_loader`."""
    param.tp_dim = dim
    param.weight_loader = shard_loader(tp, dim)


def is_sharded(param: torch.Tensor) -> bool:
    return hasattr(param, "tp_dim")


def shard_loader(tp: TensorParallel, dim: int):
    """A weight_loader for a parameter cut along `dim`: a whole checkpoint tensor is narrowed to this
    rank's part; one of the parameter's own shape (a rank's shard, e.g. from its trainer rank) is copied."""
    def load(param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(narrow_to_rank(tp, dim, param.shape, loaded))
    return load


def narrow_to_rank(tp: TensorParallel, dim: int, shape: torch.Size, loaded: torch.Tensor) -> torch.Tensor:
    if loaded.shape == shape:
        return loaded
    whole = list(shape)
    whole[dim] *= tp.size
    if list(loaded.shape) != whole:
        raise ValueError(f"shape {tuple(loaded.shape)} is neither the parameter's {tuple(shape)} nor the whole "
                         f"{tuple(whole)} it is rank {tp.rank}'s part of (dim {dim}, {tp.size} ranks)")
    return loaded.narrow(dim, tp.rank * shape[dim], shape[dim])


def _in_graph(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def reduce_sum(x: torch.Tensor, tp: TensorParallel, select: Any) -> torch.Tensor:
    """The sum of x over the ranks by the site's selected algorithm (`select` None: in rank order, the
    TP-invariant fold)."""
    if select is None:
        return all_reduce(x, "one_shot_push", tp.group)
    algorithm = select(x.numel() * x.element_size(), _in_graph(x)).algorithm
    return all_reduce(x, algorithm, tp.group)


class _ReduceFromRanks(torch.autograd.Function):
    """Forward: the sum over the ranks of their partial outputs. Backward: every rank has the whole gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, select: Any) -> torch.Tensor:
        return reduce_sum(x, tp, select)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return g, None, None


class _CopyToRanks(torch.autograd.Function):
    """Forward: the input every rank already has. Backward: the sum of the ranks' partial gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, select: Any) -> torch.Tensor:
        ctx.tp, ctx.select = tp, select
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return reduce_sum(g.contiguous(), ctx.tp, ctx.select), None, None


class _GatherColumns(torch.autograd.Function):
    """Forward: the ranks' column blocks side by side (exact). Backward: this rank's block of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp, ctx.cols = tp, x.shape[-1]
        return torch.cat(all_gather(x, tp.group), dim=-1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return g.narrow(-1, ctx.tp.rank * ctx.cols, ctx.cols).contiguous(), None


def reduce_from_ranks(x: torch.Tensor, tp: TensorParallel, select: Any) -> torch.Tensor:
    if not (torch.is_grad_enabled() and x.requires_grad):
        return reduce_sum(x, tp, select)
    return _ReduceFromRanks.apply(x, tp, select)


def copy_to_ranks(x: torch.Tensor, tp: TensorParallel, select: Any) -> torch.Tensor:
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return _CopyToRanks.apply(x, tp, select)


def gather_columns(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    if not (torch.is_grad_enabled() and x.requires_grad):
        return torch.cat(all_gather(x, tp.group), dim=-1)
    return _GatherColumns.apply(x, tp)
