"""The GRPO trainer under DeepSpeed ZeRO stage 2, across the ranks of a torch.distributed group.

The forward stays the model's own — the pinned kernels, so every sequence's logprobs are the rollout's
bits on any rank, in any micro-batch — and DeepSpeed takes over the rest of the update: the gradients
reduced over the ranks, the fp32 master weights and AdamW's state partitioned over them, the compute
weights written back from the masters after the step (`deepspeed.initialize` with `torch_adam`; on
the CPU its shared-memory all-reduce, a C++ op compiled at first use, is turned off: gloo reduces).

Work is dealt by micro-batch: the batch's micro-batches (the single trainer's `_micro`, by count and
token budget, in order) go to the ranks in turn, micro-batch j to rank j mod world. ZeRO-2 reduces
gradients inside every backward pass, so every rank must run as many as the others: a rank short of
a micro-batch in the last round runs a zero-weight pass over the batch's first sample. Each rank's
loss is normalised by the whole batch's `normalizer` and scaled by the world size (DeepSpeed averages
the ranks' gradients), so the gradient is the one-rank trainer's sum. Each rank returns the same
statistics and the whole batch's logprobs, gathered in sample order.

The run loop builds it on every rank of the trainer group with `train.zero_stage: 2`
(`TrainerWorker.start_zero`); tests/test_zero.py runs it on two CPU ranks, alone and in the loop.
Stage 3 is refused: it gathers each layer's weights in module hooks around calls that the pinned
forward's functions do not make.
"""
from __future__ import annotations

import itertools
import os
from typing import Optional

import torch
import torch.distributed as dist

from detent_rl.config import TrainSection
from detent_rl.models.model import CausalLM
from detent_rl.trainer.accumulate import lr_factor
from detent_rl.trainer.grpo import merge_stats, no_stats, stats_dict
from detent_rl.trainer.trainer import Sample, Trainer

CHECKPOINT_TAG = "zero"


class ZeroTrainer(Trainer):
    """`Trainer` with DeepSpeed ZeRO-2 doing the optimizer step over the default torch.distributed group
    (initialised by the caller, e.g. `deepspeed.init_distributed`)."""

    def __init__(self, model: CausalLM, cfg: TrainSection, ref_model: Optional[CausalLM] = None, *,
                 stage: int = 2) -> None:
        import deepspeed
        if stage != 2:
            raise ValueError(f"ZeRO stage {stage}: only stage 2 is supported (stage 3 gathers weights in module "
                             f"hooks that the pinned forward does not run through)")
        if cfg.loss.kl_coef and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        if not dist.is_initialized():
            raise RuntimeError("ZeroTrainer needs an initialised torch.distributed group (deepspeed.init_distributed)")
        self.model, self.cfg, self.ref_model = model, cfg, ref_model
        model.model.checkpoint_layers = cfg.activation_checkpointing
        self.names = [n for n, _ in model.named_parameters()]
        self.params = [p for _, p in model.named_parameters()]
        for p in self.params:
            p.requires_grad_(True)  # DeepSpeed partitions (and hooks) only parameters that take gradients
        if self.params[0].device.type == "cpu":
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        config = {
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,  # boundaries set per update
            "bf16": {"enabled": self.params[0].dtype == torch.bfloat16},
            "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
            "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "betas": list(cfg.betas), "eps": cfg.eps,
                                                      "weight_decay": cfg.weight_decay, "torch_adam": True}},
            "gradient_clipping": cfg.grad_clip if cfg.grad_clip > 0 else 0.0,
            "steps_per_print": 2 ** 31 - 1,
        }
        self.engine, self.opt, _, self.sched = deepspeed.initialize(
            model=model, model_parameters=self.params, config=config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg)))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _update(self, samples: list[Sample], old: Optional[list[torch.Tensor]],
                seen: Optional[list[torch.Tensor]] = None) -> tuple[float, float, dict]:
        """One optimizer step over `samples`, this rank's micro-batches (see the module docstring)."""
        norm = self._normalizer(samples)
        device = self.params[0].device
        micros = self._micro(samples)
        starts = [0, *itertools.accumulate(len(m) for m in micros)]
        rounds = -(-len(micros) // self.world)
        total = torch.zeros((), dtype=torch.float32, device=device)
        stats, kept = [], {}
        for r in range(rounds):
            j = r * self.world + self.rank
            pad = j >= len(micros)
            micro = [samples[0]] if pad else micros[j]
            new = torch.cat(self._logprobs(self.model, micro))
            if old is None or pad:
                logp_old = new.detach()
            else:
                logp_old = torch.cat(old[starts[j]:starts[j + 1]]).to(device, non_blocking=True)
            loss, st = self._micro_loss(micro, new, logp_old)
            loss = loss / norm
            self.engine.set_gradient_accumulation_boundary(r == rounds - 1)
            self.engine.backward(loss * (0.0 if pad else float(self.world)))
            if not pad:
                total += loss.detach()
                stats.append(st)  # on the device until the step's end, as the one-rank trainer keeps them
                if seen is not None:
                    kept[j] = new.detach().cpu()
        self.engine.step()
        agg = no_stats()
        for st in (torch.stack(stats).cpu() if stats else ()):
            merge_stats(agg, stats_dict(st))
        grad_norm = float(self.engine.get_global_grad_norm() or 0.0)
        parts: list = [None] * self.world
        dist.all_gather_object(parts, (total.item(), agg, kept))
        loss_sum, merged, everything = 0.0, no_stats(), {}
        for part_loss, part_agg, part_kept in parts:
            loss_sum += part_loss
            merge_stats(merged, part_agg)
            everything.update(part_kept)
        if seen is not None:
            seen.extend(t for j in range(len(micros)) for t in everything[j].split(
                [len(s.tokens) - s.num_prompt for s in micros[j]]))
        return loss_sum, grad_norm, merged

    # ---- state -------------------------------------------------------------------------------
    def save_state(self, path: str | os.PathLike) -> None:
        """DeepSpeed's checkpoint in directory `path`, every rank writing its partition (all ranks call it)."""
        self.engine.save_checkpoint(str(path), tag=CHECKPOINT_TAG)

    def load_state(self, path: str | os.PathLike) -> None:
        """Restore what `save_state` wrote: the compute weights, each rank's master and AdamW partition,
        the schedule."""
        loaded, _ = self.engine.load_checkpoint(str(path), tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
        if loaded is None:
            raise FileNotFoundError(f"{path}: no ZeRO checkpoint (tag {CHECKPOINT_TAG!r}) there")

    def state_dict(self) -> dict:
        raise NotImplementedError("a ZeRO trainer's state is partitioned over its ranks: save_state / load_state")

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError("a ZeRO trainer's state is partitioned over its ranks: save_state / load_state")
