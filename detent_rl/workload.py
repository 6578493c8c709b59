"""One RL step's shapes as a workload (`Workload`): what `python -m detent_rl.tune` profiles and tunes
for, runnable on an engine (generate, then the trainer's rescoring forward)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from detent_rl.kernels.selections import Deployment
from detent_rl.models.model import CausalLM
from detent_rl.models.runner import completion_logprobs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.timing import sync
from detent_rl.trainer.accumulate import micro_batches


@dataclass(frozen=True)
class Workload:
    """One RL step's shapes: `prompts` prompts of `prompt_len` tokens, each sampled `samples` times (a
    GRPO group: the engine's prefix cache prefills a prompt once, as in the run), every request
    decoding `new_tokens` (no stop token), at most `max_num_seqs` in flight (the decode batch, so the
    M the linears see), then rescored the trainer's way: forwards of at most `micro_batch` sequences and at
    most `forward_tokens` tokens (`train.max_tokens_per_micro_batch`; None: the deployment's step), cut as the
    trainer cuts its micro-batches (`trainer.accumulate.micro_batches`).
    `step_graphs`: the engine runs its prefill steps through piecewise graphs (`rollout.step_graphs`), whose
    linears see the padded token count: the profile's calls are then the run's. `chunk_size`: the engine's
    chunked-prefill tokens a sequence a step (`rollout.chunk_size`), which set the prefill's shapes. `cuda_graphs`:
    decode through graphs at padded batch sizes (None: on a CUDA device; `rollout.cuda_graphs`). `temperature`,
    `top_k`, `top_p`: the rollout's sampling (a filtered row's decode graph returns logits and the eager sampler
    filters them: other calls than a graph that samples), the rescoring's temperature too."""
    prompts: int
    prompt_len: int
    new_tokens: int
    micro_batch: int = 8
    max_num_seqs: int = 64
    samples: int = 1
    step_graphs: bool = False
    forward_tokens: Optional[int] = None
    chunk_size: int = 256
    cuda_graphs: Optional[bool] = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prompts", "prompt_len", "new_tokens", "micro_batch", "max_num_seqs", "samples", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"workload {name} must be >= 1, got {getattr(self, name)}")
        if self.forward_tokens is not None and self.forward_tokens < 1:
            raise ValueError(f"workload forward_tokens must be >= 1 or None, got {self.forward_tokens}")
        self.params(0)  # the sampling settings' own checks (SamplingParams)

    def params(self, i: int) -> SamplingParams:
        """Request `i`'s sampling: seeded by its index, no stop token (every request decodes `new_tokens`)."""
        return SamplingParams(seed=i, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              max_tokens=self.new_tokens)

    @property
    def requests(self) -> int:
        return self.prompts * self.samples

    def budget(self, d: Deployment) -> int:
        """Tokens a trainer forward may hold: `forward_tokens`, capped by the deployment's step (as the
        trainer's `token_budget`)."""
        return d.max_num_tokens if self.forward_tokens is None else min(self.forward_tokens, d.max_num_tokens)

    def check(self, d: Deployment) -> None:
        """Refuse shapes the deployment cannot run: a sequence past its context, or one longer than a trainer
        forward's token budget (the trainer computes a sequence in one forward)."""
        length = self.prompt_len + self.new_tokens
        if length > d.max_context:
            raise ValueError(f"workload: {self.prompt_len} + {self.new_tokens} tokens exceed the deployment's context "
                             f"of {d.max_context}")
        if length > self.budget(d):
            raise ValueError(f"workload: a sequence of {self.prompt_len} + {self.new_tokens} tokens exceeds a "
                             f"trainer forward's budget of {self.budget(d)} tokens (the deployment's max_num_tokens "
                             f"{d.max_num_tokens}" + ("" if self.forward_tokens is None else
                                                      f", the forward_tokens {self.forward_tokens}") + ")")

    def engine(self, model: CausalLM) -> Engine:
        """An engine for this workload on `model` (its CUDA graphs are captured on its first run)."""
        d = model.selections.deployment
        self.check(d)
        # the run's slots (`workers.py`): not capped by the requests, since the decode graphs' padded sizes follow
        # the slots (5 requests in 8 slots decode at the padded 8, not 5)
        return Engine.for_requests(model, self.requests, self.prompt_len + self.new_tokens,
                                   min(d.max_batch, self.max_num_seqs), step_graphs=self.step_graphs,
                                   chunk_size=self.chunk_size, cuda_graphs=self.cuda_graphs)

    def run(self, engine: Engine) -> float:
        """Seconds to generate and rescore the workload on `engine` (synchronised on the GPU); its
        prefix cache is flushed first, so every run does the same work."""
        return sum(self.run_phases(engine))

    def run_phases(self, engine: Engine) -> tuple[float, float]:
        """`run`'s seconds by phase: (generate, rescore)."""
        model = engine.model
        g = torch.Generator().manual_seed(0)
        group = torch.randint(0, model.config.vocab_size, (self.prompts, self.prompt_len), generator=g).tolist()
        prompts = [p for p in group for _ in range(self.samples)]
        params = [self.params(i) for i in range(self.requests)]
        engine.flush_cache()
        sync(model.device)
        t0 = time.perf_counter()
        seqs = engine.generate(prompts, params)
        sync(model.device)
        t1 = time.perf_counter()
        budget = self.budget(model.selections.deployment)
        with torch.inference_mode():
            for part in micro_batches([len(s.tokens) for s in seqs], self.micro_batch, budget, seqs):
                completion_logprobs(model, [(s.tokens, s.num_prompt) for s in part], [self.temperature] * len(part))
        sync(model.device)
        return t1 - t0, time.perf_counter() - t1
