"""GRPO's arithmetic: group-normalised advantages and the clipped policy loss, as pure functions.

Advantages. Rewards come in groups of `group_size` samples of one prompt, in order. A sample's
advantage is its reward minus its group's mean, divided by the group's standard deviation
(unbiased=False) + eps when `std` is on (GRPO), left undivided when off (Dr.GRPO).

Loss per token t of a sequence with advantage A:

    ratio  = exp(logp_new - logp_old)                 logp_old: the trainer's rescore before the update
    pg     = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)     (DAPO's clip-higher)
    w      = min(exp(logp_old - logp_rollout), tis_cap)   truncated importance sampling (off: w = 1)
    kl     = k1: logp_new - logp_ref;  k3: exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1
    loss_t = w * pg + kl_coef * kl

With the detent arm logp_old == logp_rollout bit for bit, so w == 1 exactly, and on the first
minibatch logp_new == logp_old, so ratio == 1.0 exactly for every token.

Aggregation over a minibatch (micro-batches accumulate into it): "token-mean" sums every token's
loss and divides by the minibatch's token count; "seq-mean-token-sum" sums each sequence's tokens
and divides by the minibatch's sequence count. `normalizer` returns that divisor, so a micro-batch's
share is `sum(its token or sequence terms) / normalizer(minibatch)` and shares add up exactly.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from detent_rl.config import LossSection


def group_advantages(rewards: Sequence[float], group_size: int, *, std: bool, eps: float = 1e-6) -> list[float]:
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, group_size)
    adv = r - r.mean(1, keepdim=True)
    if std:
        adv = adv / (r.std(1, unbiased=False, keepdim=True) + eps)
    return adv.view(-1).tolist()


def normalizer(lengths: Sequence[int], cfg: LossSection) -> int:
    """The divisor of a minibatch whose sequences have these completion lengths."""
    return sum(lengths) if cfg.aggregation == "token-mean" else len(lengths)


STATS = ("ratio_sum", "ratio_min", "ratio_max", "ratio_ones", "clipped", "kl_sum", "tokens")


def tokens_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_rollout: torch.Tensor,
                advantage: float | torch.Tensor, cfg: LossSection, logp_ref: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of loss_t over the tokens, their statistics): 1-D fp32 logprobs over the completion tokens of
    one sequence or of a whole micro-batch's sequences end to end, `advantage` a number or one value per
    token. The statistics stay on the device, a float64 vector in `STATS` order (`stats_dict` reads it),
    so a micro-batch costs no synchronisation with the device."""
    ratio = torch.exp(logp_new - logp_old)
    a = torch.as_tensor(advantage, dtype=ratio.dtype).to(ratio.device, non_blocking=True)
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg = -torch.minimum(ratio * a, clipped * a)
    if cfg.tis_cap is not None:
        pg = pg * torch.exp(logp_old - logp_rollout).clamp(max=cfg.tis_cap).detach()
    loss = pg
    kl = None
    if cfg.kl_coef:
        if logp_ref is None:
            raise ValueError("kl_coef > 0 needs the reference model's logprobs")
        d = logp_ref - logp_new
        kl = -d if cfg.kl_estimator == "k1" else torch.exp(d) - d - 1.0
        loss = loss + cfg.kl_coef * kl
    with torch.no_grad():
        r = ratio.detach().double()
        zero = r.new_zeros(())
        stats = torch.stack([r.sum(), r.min(), r.max(), (ratio == 1.0).sum().double(),
                             (ratio != clipped).sum().double(), kl.detach().double().sum() if kl is not None else zero,
                             zero + ratio.numel()])
    return loss.sum(), stats


def stats_dict(stats: torch.Tensor) -> dict:
    """`tokens_loss`'s statistics vector by name (one device read), counts as ints."""
    values = dict(zip(STATS, stats.tolist()))
    for key in ("ratio_ones", "clipped", "tokens"):
        values[key] = int(values[key])
    return values


def no_stats() -> dict:
    """An empty running total of `stats_dict`'s statistics, for `merge_stats`."""
    return {"ratio_sum": 0.0, "ratio_min": math.inf, "ratio_max": -math.inf, "ratio_ones": 0, "clipped": 0,
            "kl_sum": 0.0, "tokens": 0}


def merge_stats(into: dict, st: dict) -> None:
    """Add one sequence's (or minibatch's) token statistics into a running total."""
    for key in ("ratio_sum", "ratio_ones", "clipped", "kl_sum", "tokens"):
        into[key] += st[key]
    into["ratio_min"] = min(into["ratio_min"], st["ratio_min"])
    into["ratio_max"] = max(into["ratio_max"], st["ratio_max"])
