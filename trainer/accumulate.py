"""How a trainer's optimizer step is cut and accumulated: micro-batches of a minibatch, the step's gradients in
flat buffers added into the fp32 masters', and the learning-rate schedule (the detent, stock and ZeRO trainers
alike)."""
from __future__ import annotations

import math

import torch

from detent_rl.config import TrainSection


def lr_factor(cfg: TrainSection):
    """The learning rate's multiplier at optimizer step `step` (linear warm-up, then constant, linear or cosine
    decay over every step of the run: `train.steps` x `train.updates_per_batch`)."""
    total = max(1, cfg.steps * cfg.updates_per_batch)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
        if cfg.lr_schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def micro_batches(lengths: list[int], max_seqs: int, max_tokens: int, items: list) -> list[list]:
    """`items` cut into consecutive runs of at most `max_seqs` items whose `lengths` sum to at most
    `max_tokens` (greedy, in order). A sequence longer than `max_tokens` alone is refused, naming it:
    the trainer's forward computes a sequence in one step."""
    runs, run, tokens = [], [], 0
    for i, (n, item) in enumerate(zip(lengths, items)):
        if n > max_tokens:
            raise ValueError(f"sample {i} has {n} tokens, more than a micro-batch's budget of {max_tokens} "
                             f"(train.max_tokens_per_micro_batch, at most the deployment's model.max_num_tokens)")
        if run and (len(run) == max_seqs or tokens + n > max_tokens):
            runs.append(run)
            run, tokens = [], 0
        run.append(item)
        tokens += n
    if run:
        runs.append(run)
    return runs


class FlatGrads:
    """The step's gradients in flat buffers: each compute weight's `.grad` is a view of one buffer per
    dtype (autograd accumulates into an existing `.grad` in place, as DDP's bucket views rely on), and
    each fp32 master's `.grad` a view of one fp32 buffer; `accumulate` adds a micro-batch's into the
    masters' (one kernel per dtype) and clears it."""

    def __init__(self, params: list[torch.nn.Parameter], masters: list[torch.nn.Parameter]) -> None:
        self.pairs = []
        if params is masters:  # fp32 weights that are their own masters (StockTrainer): autograd accumulates
            flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
            at = 0
            for p in params:
                p.grad = flat[at:at + p.numel()].view_as(p)
                at += p.numel()
            return
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(params):
            by_dtype.setdefault(p.dtype, []).append(i)
        for members in by_dtype.values():
            size = sum(params[i].numel() for i in members)
            flat = torch.zeros(size, dtype=params[members[0]].dtype, device=params[members[0]].device)
            flat_master = torch.zeros(size, dtype=torch.float32, device=masters[members[0]].device)
            at = 0
            for i in members:
                n = params[i].numel()
                params[i].grad = flat[at:at + n].view_as(params[i])
                masters[i].grad = flat_master[at:at + n].view_as(masters[i])
                at += n
            self.pairs.append((flat, flat_master))

    def accumulate(self) -> None:
        for flat, flat_master in self.pairs:
            flat_master.add_(flat)
            flat.zero_()
