"""What `python -m detent_rl.tune` profiles and tunes for, runnable on an engine: one RL step's shapes (`Workload`:
generate, then the trainer's rescoring forward; `recipe_workload`: a recipe's), or online serving (`ServingWorkload`:
the bench's Poisson trace, requests arriving while the engine steps)."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from detent_rl.bench_cases import Shapes, poisson_arrivals, trace_of
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.kernels.selections import Deployment
from detent_rl.models.model import CausalLM
from detent_rl.models.runner import completion_logprobs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.timing import sync
from detent_rl.trainer.accumulate import micro_batches


def graph_options(step_graphs: bool | str) -> dict:
    """The engine's step-graph options for a workload's `step_graphs` (False, True: the pieces, "whole")."""
    return {"step_graphs": step_graphs is True, "full_steps": step_graphs == "whole"}


@dataclass(frozen=True)
class Workload:
    """One RL step's shapes: `prompts` prompts of `prompt_len` tokens, each sampled `samples` times (a
    GRPO group: the engine's prefix cache prefills a prompt once, as in the run), every request
    decoding `new_tokens` (no stop token), at most `max_num_seqs` in flight (the decode batch, so the
    M the linears see), then rescored the trainer's way: forwards of at most `micro_batch` sequences and at
    most `forward_tokens` tokens (`train.max_tokens_per_micro_batch`; None: the deployment's step), cut as the
    trainer cuts its micro-batches (`trainer.accumulate.micro_batches`).
    `step_graphs`: the engine runs its prefill steps through piecewise graphs (`rollout.step_graphs`), whose
    linears see the padded token count: the profile's calls are then the run's; "whole": through whole-step graphs
    (`rollout.step_graphs: whole`, `rollout/full_steps.py`). `chunk_size`: the engine's
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
    step_graphs: bool | str = False
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
                                   min(d.max_batch, self.max_num_seqs), **graph_options(self.step_graphs),
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



@dataclass(frozen=True)
class ServingWorkload:
    """Online serving's shapes: the bench's Poisson trace (`bench_cases.trace_of`: `requests` requests of
    `prompt_range` prompt and `new_range` new tokens, sampled at `temperature`), each added to the engine at its
    arrival, a Poisson process of `arrivals_per_step` requests per engine step (seeded, so every run makes the same
    steps: the profile does not depend on the machine's speed, as arrivals in seconds would), at most
    `max_num_seqs` in flight. The engine's steps then mix prefill chunks with decode rows and decode at the batch
    sizes the arrivals leave, the calls an online serve makes, which an offline batch does not (all its prompts at
    once, then decode at a shrinking batch). The bench's Poisson case: ~0.1 requests a step (82 requests/s at its
    ~1.2 ms steps, 0.5B, session 38). `step_graphs`, `chunk_size`, `cuda_graphs`: as `Workload`'s. Nothing is
    rescored (`run_phases`' second phase is 0)."""
    requests: int = 64
    prompt_range: tuple[int, int] = (64, 512)
    new_range: tuple[int, int] = (32, 256)
    arrivals_per_step: float = 0.1
    max_num_seqs: int = 64
    step_graphs: bool | str = False
    chunk_size: int = 256
    cuda_graphs: Optional[bool] = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("requests", "max_num_seqs", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"serving workload {name} must be >= 1, got {getattr(self, name)}")
        for name in ("prompt_range", "new_range"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"serving workload {name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        if not self.arrivals_per_step > 0:
            raise ValueError(f"serving workload arrivals_per_step must be > 0, got {self.arrivals_per_step}")

    def trace(self, vocab: int) -> list[tuple[list[int], SamplingParams]]:
        shapes = Shapes(poisson_requests=self.requests, poisson_prompt=self.prompt_range, poisson_new=self.new_range)
        return [(p, SamplingParams(seed=sp.seed, temperature=self.temperature, max_tokens=sp.max_tokens))
                for p, sp in trace_of(shapes, vocab)]

    def arrival_steps(self) -> list[int]:
        """Each request's arrival, in engine steps from the first (in order)."""
        return [math.floor(t) for t in poisson_arrivals(self.requests, self.arrivals_per_step)]

    def check(self, d: Deployment) -> None:
        longest = self.prompt_range[1] + self.new_range[1]
        if longest > d.max_context:
            raise ValueError(f"serving workload: {self.prompt_range[1]} + {self.new_range[1]} tokens exceed the "
                             f"deployment's context of {d.max_context}")

    def engine(self, model: CausalLM) -> Engine:
        d = model.selections.deployment
        self.check(d)
        return Engine.for_requests(model, self.requests, self.prompt_range[1] + self.new_range[1],
                                   min(d.max_batch, self.max_num_seqs), **graph_options(self.step_graphs),
                                   chunk_size=self.chunk_size, cuda_graphs=self.cuda_graphs)

    def run(self, engine: Engine) -> float:
        return sum(self.run_phases(engine))

    def run_phases(self, engine: Engine) -> tuple[float, float]:
        """(seconds to serve the trace, 0.0); the prefix cache is flushed first."""
        trace, due = self.trace(engine.model.config.vocab_size), self.arrival_steps()
        engine.flush_cache()
        sync(engine.model.device)
        t0, step, at = time.perf_counter(), 0, 0
        while at < len(trace) or not engine.idle:
            if engine.idle:
                step = max(step, due[at])  # nothing in flight: the next request's arrival
            while at < len(trace) and due[at] <= step:
                engine.add(*trace[at])
                at += 1
            engine.step()
            step += 1
        sync(engine.model.device)
        return time.perf_counter() - t0, 0.0


def recipe_workload(recipe_path: str, overrides: list[str]) -> tuple[CausalLM, Workload, Callable]:
    """The recipe's model (as its workers build it), one of its steps as a workload, and a builder of
    the same model with another tuple."""
    from detent_rl.config import RecipeError, load_recipe
    from detent_rl.setup import prepare
    recipe = load_recipe(recipe_path, overrides)
    if recipe.run.arm != "detent":
        raise RecipeError(f"{recipe.source}: run.arm: {recipe.run.arm}: the tuner commits the detent arm's pins (a "
                          f"tuple the {recipe.run.arm} arm would not take)")
    for key, degree in (("model.tp_size", recipe.model.tp_size), ("rollout.tp_size", recipe.rollout.tp_size or 1)):
        if degree > 1:  # its ranks' sites are cut shapes, in processes the tuner does not start
            raise RecipeError(f"{recipe.source}: {key}: {degree}: the tuner profiles one process, not a "
                              f"tensor-parallel group (only a run whose model is on one rank can be tuned)")
    setup = prepare(recipe)
    ro, tr = recipe.rollout, recipe.train
    prompt = round(statistics.mean(len(p) for p in setup.prompts.values()))
    # with engine replicas (data parallel) each engine runs its share of the step's groups, dealt in turn: the
    # first engine's (the most) is the shapes one engine sees
    workload = Workload(prompts=-(-ro.prompts_per_step // ro.num_engines), prompt_len=prompt,
                        new_tokens=ro.max_new_tokens, micro_batch=tr.micro_batch_size, max_num_seqs=ro.max_num_seqs,
                        samples=ro.samples_per_prompt,
                        step_graphs="whole" if ro.whole(setup.spec.device) else ro.pieces(setup.spec.device),
                        forward_tokens=tr.max_tokens_per_micro_batch,
                        chunk_size=ro.chunk_size, cuda_graphs=ro.graphs(), temperature=ro.temperature, top_k=ro.top_k,
                        top_p=ro.top_p)
    spec = setup.spec

    def build(t: CommitmentTuple) -> CausalLM:
        from detent_rl.models import load_model
        from detent_rl.model_spec import DTYPES
        return load_model(spec.path, spec.arm, device=spec.device, dtype=DTYPES[spec.dtype], commitment=t,
                          max_context=spec.max_context, max_batch=spec.max_batch, max_num_tokens=spec.max_num_tokens)
    return spec.load(), workload, build
