"""What a run needs before its first step, from the recipe: the checkpoint, tokenizer, tasks,
reward, the two workers' model spec, Ray, and the per-sample seeds."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Callable

import torch

from detent_rl.config import Recipe
from detent_rl.data import PromptTooLong, Task, load_tasks, render_prompt, split_eval
from detent_rl.models.builtin import builtin_checkpoint, has_own_tokenizer
from detent_rl.models.config import ModelConfig
from detent_rl.rewards import load_reward
from detent_rl.tokenizer import Tokenizer, load_tokenizer, tiny_tokenizer
from detent_rl.trainer.grpo import LossConfig
from detent_rl.trainer.trainer import OptimConfig
from detent_rl.workers import ModelSpec

PAGE = 16


@dataclass
class RunSetup:
    device: str
    checkpoint: Path
    tokenizer: Tokenizer
    spec: ModelSpec
    train_tasks: list[Task]
    eval_tasks: list[Task]
    prompts: dict[str, list[int]]  # task id -> prompt tokens
    reward: Callable[[str, Task], float]
    optim: OptimConfig
    loss: LossConfig


def sample_seed(run_seed: int, step: int, task_id: str, index: int) -> int:
    """A 63-bit seed per (run seed, step, prompt id, sample index): distinct across all four."""
    h = hashlib.blake2b(f"{run_seed}\x1f{step}\x1f{task_id}\x1f{index}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1


def prepare(recipe: Recipe) -> RunSetup:
    device = recipe.run.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{recipe.source}: run.device: cuda, but no CUDA device is available")
    m = recipe.model
    checkpoint = Path(m.path) if m.path else builtin_checkpoint(m.builtin)
    if m.path or has_own_tokenizer(m.builtin):
        tokenizer = load_tokenizer(checkpoint)
    else:
        tokenizer = tiny_tokenizer(ModelConfig.from_file(checkpoint).vocab_size)
    d, ro, tr = recipe.data, recipe.rollout, recipe.train
    tasks = load_tasks(d.source, split=d.split, question_key=d.question_key, answer_key=d.answer_key, size=d.size,
                       seed=d.seed, task_config=dict(d.task_config) or None, subset=d.subset)
    prompts = {}
    for t in tasks:  # a prompt over data.max_prompt_tokens is dropped, with its task
        try:
            prompts[t.id] = render_prompt(t, tokenizer, template=d.template, system_prompt=d.system_prompt,
                                          suffix=d.prompt_suffix, max_prompt_tokens=d.max_prompt_tokens)
        except PromptTooLong:
            pass
    if len(prompts) < len(tasks):
        print(f"data: dropped {len(tasks) - len(prompts)} of {len(tasks)} tasks whose prompt exceeds "
              f"data.max_prompt_tokens = {d.max_prompt_tokens}")
    train_tasks, eval_tasks = split_eval([t for t in tasks if t.id in prompts], d.eval_size)
    if len(train_tasks) < ro.prompts_per_step:
        raise SystemExit(f"{recipe.source}: data.size leaves {len(train_tasks)} training tasks, fewer than "
                         f"rollout.prompts_per_step = {ro.prompts_per_step}")
    batch = ro.prompts_per_step * ro.samples_per_prompt
    spec = ModelSpec(path=str(checkpoint), arm=recipe.run.arm, device=device, dtype=m.dtype,
                     max_context=m.max_context, max_batch=max(ro.max_num_seqs, tr.micro_batch_size, batch, 8),
                     max_num_tokens=max(2048, tr.micro_batch_size * m.max_context, ro.chunk_size),
                     commitment=m.commitment, threads=1 if device == "cpu" else 0)
    lo = tr.loss
    return RunSetup(device, checkpoint, tokenizer, spec, train_tasks, eval_tasks, prompts, load_reward(d.reward),
                    OptimConfig(lr=tr.lr, lr_schedule=tr.lr_schedule, warmup_steps=tr.warmup_steps,
                                weight_decay=tr.weight_decay, betas=tuple(tr.betas), eps=tr.eps,
                                grad_clip=tr.grad_clip, micro_batch_size=tr.micro_batch_size,
                                updates_per_batch=tr.updates_per_batch, total_steps=tr.steps),
                    LossConfig(clip_low=lo.clip_low, clip_high=lo.clip_high, aggregation=lo.aggregation,
                               kl_coef=lo.kl_coef, kl_estimator=lo.kl_estimator, tis_cap=lo.tis_cap))


class Inline:
    """A worker in the driver's process behind the actor call syntax: `w.method.remote(...)` returns
    the result, which `get` passes through (ray.mode: inline)."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._worker, name)
        return SimpleNamespace(remote=method)


def get(recipe: Recipe, value: Any) -> Any:
    """ray.get for Ray actors' results; the value itself inline."""
    if recipe.ray.mode == "inline":
        return value
    import ray
    return ray.get(value)


def start_workers(recipe: Recipe, setup: RunSetup) -> tuple[Any, Any]:
    """Ray (a cluster at ray.address / RAY_ADDRESS, else local) and the rollout and trainer actors,
    or, with ray.mode: inline, the two workers in this process."""
    from detent_rl.workers import RolloutWorker, TrainerWorker
    ro = recipe.rollout
    seqs = ro.prompts_per_step * ro.samples_per_prompt
    blocks = ro.num_blocks or min(ro.max_num_seqs, seqs) * -(-recipe.model.max_context // PAGE) + 8
    graphs = {"auto": None, "on": True, "off": False}[ro.cuda_graphs]
    rollout_args = dict(num_blocks=blocks, max_num_seqs=min(ro.max_num_seqs, setup.spec.max_batch),
                        chunk_size=ro.chunk_size, cuda_graphs=graphs)
    if recipe.ray.mode == "inline":
        return (Inline(RolloutWorker(setup.spec, **rollout_args)),
                Inline(TrainerWorker(setup.spec, setup.optim, setup.loss)))
    import ray
    address = recipe.ray.address or os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if address:
            kwargs["address"] = address
        elif recipe.ray.num_cpus:
            kwargs["num_cpus"] = recipe.ray.num_cpus
        ray.init(**kwargs)
    gpus = (0.5 if recipe.ray.colocate else 1) if setup.device == "cuda" else 0
    rollout = ray.remote(RolloutWorker).options(num_cpus=1, num_gpus=gpus).remote(setup.spec, **rollout_args)
    trainer = ray.remote(TrainerWorker).options(num_cpus=1, num_gpus=gpus).remote(setup.spec, setup.optim, setup.loss)
    return rollout, trainer
