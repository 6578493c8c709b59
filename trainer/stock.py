"""The stock arm's trainer: what a user runs instead of detent_rl's, for the side-by-side step.

TRL's and OpenRLHF's GRPO shape: transformers' own model with fp32 master weights, the forward under
autocast to the engine's dtype (on the GPU cuBLAS GEMMs and SDPA attention: none of our kernels and
no pinned selection), AdamW (fused on the GPU), the LM head over the completion positions only. The
step's arithmetic — micro-batches, the GRPO loss and its statistics, clipping, the schedule, state
and resume, the free bit-check — is `Trainer`'s, inherited; only the forward (`_logprobs`) and the
weights' layout differ. Its logprobs are not the rollout's bits (that is what the stock arm shows),
so a stock run sets `run.on_mismatch: warn` to let the check warn instead of stop.

The engine is our model code (the stock engine arm), so `compute_weights` hands it our parameter
names: the fused projections (q/k/v, gate/up) concatenated in the engine's shard order, rounded to
the compute dtype, and digested as the engine will digest them.
"""
from __future__ import annotations

from typing import Optional

import torch

from detent_rl.config import TrainSection
from detent_rl.kernels.attention import device_tensor
from detent_rl.models.loader import checkpoint_name
from detent_rl.models.model import CausalLM
from detent_rl.trainer.accumulate import lr_factor
from detent_rl.trainer.trainer import Sample, Trainer


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Every dropout off (as TRL's GRPO does by default): the policy's logprobs are a function of the
    weights, in training mode too."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


class StockTrainer(Trainer):
    def __init__(self, path: str, layout: CausalLM, cfg: TrainSection, device: str, dtype: torch.dtype,
                 token_budget: int) -> None:
        """`path`: the HF checkpoint the run starts from; `layout`: our model (weights not needed, e.g. on
        the meta device), whose parameter names and fused shards `compute_weights` follows; `dtype`: the
        engine's compute dtype (16-bit: the forward runs under autocast to it on the GPU)."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        def load() -> torch.nn.Module:
            shown = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # the run's stderr carries its own messages only
            try:
                return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="sdpa").to(device)
            finally:
                if shown:
                    hf_logging.enable_progress_bar()

        self.cfg, self.layout, self.dtype, self.device = cfg, layout, dtype, torch.device(device)
        self.hf = self.model = _without_dropout(load().train())  # transformers checkpoints in training mode only
        if cfg.activation_checkpointing:  # the method's name since transformers 5.2x; the older one before
            enable = getattr(self.hf, "activation_checkpointing_enable", None) or self.hf.gradient_checkpointing_enable
            enable()
        self.ref_model = None
        if cfg.loss.kl_coef:
            self.ref_model = load().requires_grad_(False)
        self._budget = token_budget
        self.names = [n for n, _ in self.hf.named_parameters()]
        self.params = [p for _, p in self.hf.named_parameters()]
        self.master = self.params  # fp32 parameters are their own masters: the optimizer steps them
        for p in self.params:
            p.requires_grad_(False)  # on only inside an update, as for Trainer's compute weights
        self.opt = torch.optim.AdamW(self.master, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                     weight_decay=cfg.weight_decay, fused=True if self.device.type == "cuda" else None)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_factor(cfg))
        names = set(self.names)
        missing = [checkpoint_name(n, s) for n, p in layout.named_parameters() for s in getattr(p, "shard_ids", (None,))
                   if checkpoint_name(n, s) not in names]
        if missing:
            raise ValueError(f"the stock trainer's checkpoint {path} lacks the engine's weights {missing[:5]}")

    @property
    def token_budget(self) -> int:
        cap = self.cfg.max_tokens_per_micro_batch
        return self._budget if cap is None else min(cap, self._budget)

    def _logprobs(self, model: torch.nn.Module, samples: list[Sample]) -> list[torch.Tensor]:
        """fp32 completion logprobs of each sample at its temperature: one right-padded batch through the
        decoder, the LM head on the completion rows only, log-softmax in fp32."""
        width = max(len(s.tokens) for s in samples)
        ids = torch.zeros((len(samples), width), dtype=torch.int64)
        mask = torch.zeros((len(samples), width), dtype=torch.int64)
        rows, targets, inv_t = [], [], []
        for i, s in enumerate(samples):
            ids[i, :len(s.tokens)] = torch.tensor(s.tokens)
            mask[i, :len(s.tokens)] = 1
            rows.extend(range(i * width + s.num_prompt - 1, i * width + len(s.tokens) - 1))
            targets.extend(s.tokens[s.num_prompt:])
            inv_t.extend([1.0 / (s.temperature or 1.0)] * (len(s.tokens) - s.num_prompt))
        ids, mask = ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
        autocast = self.dtype != torch.float32  # the compute dtype, as the engine runs it
        with torch.autocast(device_type=self.device.type, dtype=self.dtype, enabled=autocast):
            hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
            logits = model.get_output_embeddings()(hidden.flatten(0, 1)[device_tensor(rows, torch.int64, self.device)])
        scale = device_tensor(inv_t, torch.float32, self.device)[:, None]
        lp = torch.log_softmax(logits.float() * scale, dim=-1).gather(
            1, device_tensor(targets, torch.int64, self.device)[:, None])[:, 0]
        return list(lp.split([len(s.tokens) - s.num_prompt for s in samples]))

    def compute_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The masters rounded to the compute dtype under the engine's parameter names (fused shards
        concatenated in its order): new tensors, on the device or copied to the host."""
        hf = dict(self.hf.named_parameters())
        out = {}
        with torch.no_grad():
            for name, p in self.layout.named_parameters():
                shards: Optional[tuple] = getattr(p, "shard_ids", None)
                t = torch.cat([hf[checkpoint_name(name, s)] for s in shards]) if shards else hf[name]
                t = t.to(self.dtype)
                out[name] = t if on_device else t.cpu()
        return out
