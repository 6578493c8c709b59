"""The GRPO trainer: the engine's model code and kernels in training mode, fp32 master weights.

Weights. The model's parameters are the *compute* weights, in the model dtype (bf16 in the BF16
recipe); the optimizer owns an fp32 master copy. After each optimizer step the masters are rounded
into the compute weights in place, and those compute weights — exactly — are what the rollout
engine receives (`compute_weights`, with `models.weights.weights_digest` checked on both sides).

A step: `rescore` recomputes every sample's completion logprobs with no grad (the bit-check's
right-hand side, and GRPO's logp_old); `train` splits the batch into `updates_per_batch`
minibatches, each one optimizer step accumulated over micro-batches of at most `micro_batch_size`
sequences and `max_tokens_per_micro_batch` tokens (`accumulate.py`): a grad-enabled forward through the
same kernels (kernels.autograd — the same bits as `rescore`, so the first minibatch's ratios are exactly
1.0), the GRPO loss, backward, and the micro-batch's bf16 gradients added into the fp32 masters' gradients.
Then clipping, AdamW, the learning-rate schedule (per optimizer step), and the rounding back into the
compute weights.

Under tensor parallelism (the model's `tp`, models/parallel.py) each rank trains its part: every
rank computes the same logprobs, loss and statistics (the logits are gathered), its own parts'
gradients, and the same replicated ones (norm weights); the gradient norm sums the parts' squares
over the ranks (a pinned-order all-reduce) and counts each replicated tensor once, so every rank
clips by the same factor. Each rank saves and restores its own state.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from detent_rl.config import TrainSection
from detent_rl.kernels.attention import device_tensor
from detent_rl.kernels.allreduce import all_reduce
from detent_rl.models.model import CausalLM
from detent_rl.models.parallel import is_sharded
from detent_rl.models.runner import completion_logprobs
from detent_rl.trainer.accumulate import FlatGrads, lr_factor, micro_batches
from detent_rl.trainer.grpo import merge_stats, no_stats, normalizer, stats_dict, tokens_loss


@dataclass
class Sample:
    """One rollout sequence: what the engine returned plus what GRPO attaches to it."""
    request_id: str
    tokens: list[int]
    num_prompt: int
    rollout_logprobs: list[float]  # the engine's decode-time values, never replaced by a rescore
    temperature: float
    seed: int = 0
    reward: float = 0.0
    advantage: float = 0.0
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrainStats:
    """One `train` call: mean loss, largest grad norm, lr after it, and GRPO's token statistics."""
    loss: float
    grad_norm: float
    lr: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    clip_frac: float
    kl_ref: float
    first_minibatch_ratio_ones: float  # exactly 1.0 when the training forward reproduces the rescore
    train_tokens: int
    peak_memory_gib: float = 0.0  # the most device memory the process held during the update (0 on the CPU)


class Trainer:
    sglang: Optional[tuple[int, int]] = None  # an SGLang rollout's (split tile, context): its rows, its kernels

    def __init__(self, model: CausalLM, cfg: TrainSection, ref_model: Optional[CausalLM] = None) -> None:
        if cfg.loss.kl_coef and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.model, self.cfg, self.ref_model = model, cfg, ref_model
        model.model.checkpoint_layers = cfg.activation_checkpointing
        self.names = [n for n, _ in model.named_parameters()]  # a tied head appears once
        self.params = [p for _, p in model.named_parameters()]
        self.master = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        # fused on the GPU (a few kernels for all the weights; deterministic, and the same on resume)
        self.opt = torch.optim.AdamW(self.master, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                     weight_decay=cfg.weight_decay, fused=True if self.master[0].is_cuda else None)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_factor(cfg))

    @property
    def weights_device(self) -> torch.device:
        """Where the optimizer's weights (and the update) are."""
        return self.opt.param_groups[0]["params"][0].device

    def _micro(self, samples: list[Sample]) -> list[list[Sample]]:
        """Consecutive runs of `samples`, each at most `micro_batch_size` sequences and at most the
        token budget (`max_tokens_per_micro_batch`, capped by the deployment's step), in order: the
        pinned forward gives every sequence the same bits in any of them."""
        return micro_batches([len(s.tokens) for s in samples], self.cfg.micro_batch_size, self.token_budget,
                             samples)

    @property
    def token_budget(self) -> int:
        step = self.model.selections.deployment.max_num_tokens
        cap = self.cfg.max_tokens_per_micro_batch
        return step if cap is None else min(cap, step)

    def _logprobs(self, model: CausalLM, samples: list[Sample]) -> list[torch.Tensor]:
        return completion_logprobs(model, [(s.tokens, s.num_prompt) for s in samples],
                                   [s.temperature for s in samples], sglang=self.sglang)

    @torch.no_grad()
    def rescore(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Every sample's completion logprobs, fp32 on the CPU, computed the training forward's way."""
        out = []
        for micro in self._micro(samples):
            out.extend(t.cpu() for t in self._logprobs(self.model, micro))
        return out

    def train(self, samples: list[Sample], old_logprobs: list[torch.Tensor]) -> TrainStats:
        """`updates_per_batch` optimizer steps over the batch; returns the step's statistics."""
        if len(samples) != len(old_logprobs):
            raise ValueError(f"{len(samples)} samples but {len(old_logprobs)} old logprob tensors")
        return self._train(samples, old_logprobs)

    def train_rollout_old(self, samples: list[Sample]) -> tuple[TrainStats, list[torch.Tensor]]:
        """`updates_per_batch` optimizer steps with the rollout's own logprobs as GRPO's logp_old (no
        rescore pass). Returns the stats and the first minibatch's forward logprobs (fp32, CPU): its
        forward runs on the rollout's weights, so those are the bit-check's trainer side for the first
        minibatch's samples (the caller checks them). With the bits equal, the step is the one
        `rescore` + `train` takes, bit for bit."""
        old = [torch.tensor(s.rollout_logprobs, dtype=torch.float32) for s in samples]
        first: list[torch.Tensor] = []
        return self._train(samples, old, first, first_only=True), first

    def _train(self, samples: list[Sample], old_logprobs: Optional[list[torch.Tensor]],
               seen: Optional[list[torch.Tensor]] = None, first_only: bool = False) -> TrainStats:
        k = self.cfg.updates_per_batch
        size = -(-len(samples) // k)
        device = self.weights_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        stats = no_stats()
        losses, norms, first_ratio = [], [], None
        for m in range(0, len(samples), size):
            mb = samples[m:m + size]
            old = None if old_logprobs is None else old_logprobs[m:m + size]
            loss, norm, mb_stats = self._update(mb, old, seen if m == 0 or not first_only else None)
            losses.append(loss)
            norms.append(norm)
            if first_ratio is None:
                first_ratio = mb_stats["ratio_ones"] / max(1, mb_stats["tokens"])
            merge_stats(stats, mb_stats)
        t = max(1, stats["tokens"])
        return TrainStats(loss=sum(losses) / len(losses), grad_norm=max(norms), lr=self.sched.get_last_lr()[0],
                          ratio_mean=stats["ratio_sum"] / t, ratio_min=stats["ratio_min"],
                          ratio_max=stats["ratio_max"], clip_frac=stats["clipped"] / t, kl_ref=stats["kl_sum"] / t,
                          first_minibatch_ratio_ones=first_ratio, train_tokens=stats["tokens"],
                          peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2 ** 30
                          if device.type == "cuda" else 0.0)

    def train_checked(self, samples: list[Sample]) -> tuple[TrainStats, list[torch.Tensor]]:
        """The one optimizer step of an on-policy batch (`updates_per_batch` 1) without a rescore pass:
        every micro-batch's forward with grad runs on the rollout's weights, so its logprobs are the
        trainer's side of the bit-check and GRPO's logp_old (ratio exactly 1 by construction). Returns
        the stats and those logprobs (fp32, CPU), for the caller to check against the rollout's. With
        the bits equal, the step is the one `rescore` + `train` takes, bit for bit."""
        if self.cfg.updates_per_batch != 1:
            raise ValueError(f"train_checked is one update per batch; updates_per_batch is "
                             f"{self.cfg.updates_per_batch}: rescore, then train")
        seen: list[torch.Tensor] = []
        return self._train(samples, None, seen), seen

    def _micro_loss(self, micro: list[Sample], new: torch.Tensor, logp_old: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GRPO's loss over one micro-batch's tokens (not yet normalised) and its statistics, from the
        forward's logprobs `new`: the rollout's logprobs, the advantages per token, the reference's
        logprobs when a KL term is on."""
        device = new.device
        ref = None
        if self.cfg.loss.kl_coef:
            with torch.no_grad():
                ref = torch.cat(self._logprobs(self.ref_model, micro))
        roll = device_tensor([x for s in micro for x in s.rollout_logprobs], torch.float32, device)
        lengths = [len(s.rollout_logprobs) for s in micro]
        adv = device_tensor([s.advantage for s in micro], torch.float32, device).repeat_interleave(
            device_tensor(lengths, torch.int64, device), output_size=sum(lengths))
        return tokens_loss(new, logp_old, roll, adv, self.cfg.loss, ref)

    def _normalizer(self, samples: list[Sample]) -> int:
        """GRPO's loss normaliser over the whole batch (`grpo.normalizer`), once every sample is checked to
        carry one rollout logprob per completion token."""
        for i, s in enumerate(samples):
            if len(s.rollout_logprobs) != len(s.tokens) - s.num_prompt:
                raise ValueError(f"sample {i} ({s.request_id}): {len(s.rollout_logprobs)} rollout logprobs for "
                                 f"{len(s.tokens) - s.num_prompt} completion tokens")
        return normalizer([len(s.tokens) - s.num_prompt for s in samples], self.cfg.loss)

    def _update(self, samples: list[Sample], old: Optional[list[torch.Tensor]],
                seen: Optional[list[torch.Tensor]] = None) -> tuple[float, float, dict]:
        """One optimizer step over `samples`. `old` None: each forward's own logprobs are logp_old.
        Each forward's logprobs are appended (fp32, CPU) to `seen` when it is given.

        Nothing in the micro-batch loop waits for the device (the update was bound by the host: one
        loss and a handful of reads per sequence): each micro-batch's loss is one vectorised call over
        its tokens, its statistics stay on the device until the step's end, and the gradients land in
        flat buffers — the compute weights' `.grad` are views of one buffer per dtype (autograd adds
        into them in place), added into the fp32 masters' flat gradient with one kernel per micro-batch."""
        norm = self._normalizer(samples)
        device = self.master[0].device
        grads = FlatGrads(self.params, self.master)
        losses, stats, kept = [], [], []
        for p in self.params:
            p.requires_grad_(True)
        try:
            at = 0
            for micro in self._micro(samples):
                new = torch.cat(self._logprobs(self.model, micro))
                if seen is not None:
                    kept.append(new.detach())
                if old is None:
                    logp_old = new.detach()
                else:
                    logp_old = torch.cat(old[at:at + len(micro)]).to(device, non_blocking=True)
                at += len(micro)
                loss, st = self._micro_loss(micro, new, logp_old)
                loss = loss / norm
                loss.backward()
                losses.append(loss.detach())
                stats.append(st)
                grads.accumulate()
        finally:
            for p in self.params:
                p.requires_grad_(False)
                if self.params is not self.master:  # the masters keep theirs for the step
                    p.grad = None
        if seen is not None and kept:
            seen.extend(torch.cat(kept).cpu().split([len(s.tokens) - s.num_prompt for s in samples]))
        total = torch.stack(losses).sum().item()
        agg = no_stats()
        for st in torch.stack(stats).cpu():
            merge_stats(agg, stats_dict(st))
        clip = self.cfg.grad_clip
        if getattr(self.model, "tp", None) is None:  # (the stock trainer's HF model has none)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.master, clip if clip > 0 else math.inf).item()
        else:
            grad_norm = self._clip_tp(clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if self.params is not self.master:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.master)  # round the fp32 master into the compute dtype
        return total, grad_norm, agg

    def _clip_tp(self, clip: float) -> float:
        """clip_grad_norm_ over the whole model cut across the tensor-parallel ranks: the parts' squared
        norms summed over the ranks in rank order (fp32), each replicated tensor's counted once; every
        rank scales its gradients by the same factor. Returns the total norm."""
        sq = [torch.linalg.vector_norm(m.grad, dtype=torch.float32).square() for m in self.master]
        parts = torch.stack([s for s, p in zip(sq, self.params) if is_sharded(p)]).sum()
        whole = torch.stack([s for s, p in zip(sq, self.params) if not is_sharded(p)] or [parts * 0]).sum()
        total = (all_reduce(parts.reshape(1), "one_shot_push", self.model.tp.group)[0] + whole).sqrt()
        if clip > 0:
            coef = torch.clamp(clip / (total + 1e-6), max=1.0)
            torch._foreach_mul_([m.grad for m in self.master], coef)
        return total.item()

    # ---- weights and state -------------------------------------------------------------------
    def compute_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The compute weights by the model's own names (what the engine's update_weights takes): host
        copies, or with `on_device` the live tensors themselves (no copy: for an engine in this process,
        which copies them device to device before the next update changes them)."""
        if on_device:
            return {n: p.detach() for n, p in zip(self.names, self.params)}
        return {n: p.detach().cpu() for n, p in zip(self.names, self.params)}

    def _live_state(self) -> dict:
        """The trainer's state as references to its live tensors (no copies): fp32 masters by name,
        AdamW's state (exp_avg, exp_avg_sq, step per master, in `self.names` order), the schedule."""
        return {"master": {n: m.detach() for n, m in zip(self.names, self.master)},
                "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}

    def save_state(self, path: str | os.PathLike) -> None:
        """Write the trainer's state to file `path`, streamed from the live tensors: `torch.save`
        writes a host tensor's bytes where they lie and copies a device tensor to the host one at a
        time, so saving adds no second copy of the state to memory. `load_state` reads it back."""
        torch.save(self._live_state(), path)

    def load_state(self, path: str | os.PathLike) -> None:
        """Restore what `save_state` wrote: the file is memory-mapped and each tensor copied into the
        live masters (and compute weights) and into fresh AdamW state on the masters' device."""
        self._restore(torch.load(path, map_location="cpu", mmap=True, weights_only=True))

    def state_dict(self) -> dict:
        """An in-memory snapshot (copies: the trainer goes on updating its own tensors in place).
        Checkpoints use `save_state`, which needs no copy."""
        return copy.deepcopy({**self._live_state(),
                              "master": {n: m.detach().cpu() for n, m in zip(self.names, self.master)}})

    def load_state_dict(self, state: dict) -> None:
        self._restore(state)

    def _restore(self, state: dict) -> None:
        masters = state["master"]
        if list(masters) != self.names:
            missing, extra = sorted(set(self.names) - set(masters)), sorted(set(masters) - set(self.names))
            raise ValueError(f"trainer state does not fit this model: master weights missing {missing[:5]}, "
                             f"unexpected {extra[:5]}" if missing or extra else
                             "trainer state lists the master weights in another order than this model")
        wrong = [f"{n} {tuple(masters[n].shape)} (model {tuple(mp.shape)})"
                 for n, mp in zip(self.names, self.master) if masters[n].shape != mp.shape]
        if wrong:
            raise ValueError(f"trainer state does not fit this model: shapes differ for {wrong[:5]}")
        with torch.no_grad():
            for n, mp, p in zip(self.names, self.master, self.params):
                mp.copy_(masters[n])
                p.copy_(mp)
        opt = state["optimizer"]
        # AdamW would keep the given tensors themselves (file-backed after an mmap load): own copies
        # on the masters' device instead ("step" stays where it was saved, as AdamW wants it).
        own = {i: {k: (v.clone() if k == "step" else v.to(self.master[i].device, copy=True))
                   if torch.is_tensor(v) else v for k, v in st.items()} for i, st in opt["state"].items()}
        self.opt.load_state_dict({**opt, "state": own})
        self.sched.load_state_dict(state["scheduler"])
