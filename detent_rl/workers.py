"""The two workers of a run — rollout (the engine) and trainer — as plain classes; the driver
wraps them in Ray actors (`ray.remote`), so each owns its own process, model copy and device.

Both build their model from the same `ModelSpec` (checkpoint directory, arm, dtype, limits,
commitment tuple), so both select the same kernels with the same pins. The trainer's compute
weights travel to the engine after every update together with their sha256; the rollout worker
recomputes the hash of what it now holds and refuses a mismatch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from detent_rl.kernels.selections import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.trainer.grpo import LossConfig
from detent_rl.trainer.trainer import OptimConfig, Sample, Trainer, weights_sha256

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class ModelSpec:
    path: str
    arm: str
    device: str
    dtype: str
    max_context: int
    max_batch: int
    max_num_tokens: int
    commitment: Optional[str] = None
    threads: int = 0  # CPU: torch threads in this worker (0 = leave torch's default)

    def load(self):
        if self.device == "cpu" and self.threads:
            torch.set_num_threads(self.threads)
        commitment = CommitmentTuple.load(self.commitment) if self.commitment else None
        return load_model(self.path, self.arm, device=self.device, dtype=DTYPES[self.dtype], commitment=commitment,
                          max_context=self.max_context, max_batch=self.max_batch, max_num_tokens=self.max_num_tokens)


class RolloutWorker:
    def __init__(self, spec: ModelSpec, *, num_blocks: int, max_num_seqs: int, chunk_size: int,
                 cuda_graphs: Optional[bool]) -> None:
        self.model = spec.load()
        self.engine = Engine(self.model, num_blocks=num_blocks, max_num_seqs=max_num_seqs, chunk_size=chunk_size,
                             cuda_graphs=cuda_graphs)

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[dict]:
        seqs = self.engine.generate(prompts, [SamplingParams(**p) for p in params])
        return [{"tokens": s.tokens, "num_prompt": s.num_prompt, "logprobs": s.logprobs, "cached": s.num_cached}
                for s in seqs]

    def update_weights(self, weights: dict[str, torch.Tensor], sha256: str) -> str:
        self.engine.update_weights(weights)
        got = weights_sha256(self.model)
        if got != sha256:
            raise RuntimeError(f"weight sync: the rollout engine holds weights with sha256 {got}, the trainer "
                               f"sent {sha256}")
        return got

    def weights_sha256(self) -> str:
        return weights_sha256(self.model)

    def pid(self) -> int:
        return os.getpid()


class TrainerWorker:
    def __init__(self, spec: ModelSpec, optim: OptimConfig, loss: LossConfig) -> None:
        self.model = spec.load()
        ref = spec.load() if loss.kl_coef else None  # frozen reference: the starting weights
        self.trainer = Trainer(self.model, optim, loss, ref)

    def rescore(self, samples: list[Sample]) -> list[torch.Tensor]:
        return self.trainer.rescore(samples)

    def train(self, samples: list[Sample], old: list[torch.Tensor]) -> dict:
        return self.trainer.train(samples, old)

    def weights(self) -> tuple[dict[str, torch.Tensor], str]:
        w = self.trainer.compute_weights()
        return w, weights_sha256(w)

    def state_dict(self) -> dict:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state)

    def pid(self) -> int:
        return os.getpid()
