"""What a run needs before its first step, from the recipe: the checkpoint, tokenizer, tasks,
reward, the two workers' model spec, and the two worker groups (Ray actors or in-process)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from detent_rl.config import Recipe, RecipeError
from detent_rl.data import PromptTooLong, Task, load_tasks, render_prompt, split_eval
from detent_rl.kernels.commitment import CommitmentError
from detent_rl.models.builtin import builtin_checkpoint, has_own_tokenizer
from detent_rl.models.config import ModelConfig
from detent_rl.rewards import load_reward
from detent_rl.tokenizer import Tokenizer, load_tokenizer, tiny_tokenizer
from detent_rl.group import RayPlacement, WorkerGroup
from detent_rl.workers import ModelSpec, RolloutWorker, TrainerWorker


@dataclass
class RunSetup:
    device: str
    checkpoint: Path
    tokenizer: Tokenizer
    spec: ModelSpec  # the trainer's
    rollout_spec: ModelSpec  # each engine's (its tensor-parallel degree may differ)
    train_tasks: list[Task]
    eval_tasks: list[Task]
    prompts: dict[str, list[int]]  # task id -> prompt tokens
    reward: Callable[[str, Task], float]


def prepare(recipe: Recipe) -> RunSetup:
    device = recipe.run.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RecipeError(f"{recipe.source}: run.device: cuda, but no CUDA device is available")
    m = recipe.model
    checkpoint = Path(m.path) if m.path else builtin_checkpoint(m.builtin)
    if m.path or has_own_tokenizer(m.builtin):
        tokenizer = load_tokenizer(checkpoint)
    else:
        tokenizer = tiny_tokenizer(ModelConfig.from_file(checkpoint).vocab_size)
    d, ro = recipe.data, recipe.rollout
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
        raise RecipeError(f"{recipe.source}: data.size leaves {len(train_tasks)} training tasks, fewer than "
                         f"rollout.prompts_per_step = {ro.prompts_per_step}")
    spec = model_spec(recipe, checkpoint, device)
    rollout_spec = replace(spec, tp_size=rollout_tp(recipe))
    for s, key in ((spec, "model.tp_size"), (rollout_spec, "rollout.tp_size")):
        try:
            s.check()
        except CommitmentError as e:  # unreadable, or made for another deployment or model
            raise RecipeError(f"{recipe.source}: model.commitment: {e}") from None
        except ValueError as e:  # the model does not cut over that many ranks (or not invariantly)
            if s.tp_size == 1 and not m.tp_invariant:
                raise
            raise RecipeError(f"{recipe.source}: {key}: {s.tp_size}: {e}") from None
    return RunSetup(device, checkpoint, tokenizer, spec, rollout_spec, train_tasks, eval_tasks, prompts,
                    load_reward(d.reward))


def _check_ray_resources(recipe: Recipe, need: dict, have: dict) -> None:
    """An actor that cannot be placed waits forever: refuse a group the Ray cluster cannot hold, now."""
    for kind, n in need.items():
        if n > have.get(kind, 0) + 1e-9:
            hint = " (raise ray.num_cpus)" if kind == "CPU" and not recipe.ray.address else ""
            ranks = f" ({recipe.train.num_gpus} ranks)" if recipe.train.num_gpus > 1 else ""
            raise RecipeError(f"{recipe.source}: rollout.num_engines: {recipe.rollout.num_engines} engine(s) and the "
                              f"trainer{ranks} need {n:g} {kind}(s) of Ray; the cluster has {have.get(kind, 0):g}"
                              f"{hint}")


def model_spec(recipe: Recipe, checkpoint: Path, device: str) -> ModelSpec:
    """The run's model spec: its deployment limits sized for the rollout batch, the trainer's micro-batches
    and the chunked prefill (what a tuned tuple must record), and the rollout backend's split tile."""
    m, ro, tr = recipe.model, recipe.rollout, recipe.train
    batch = ro.prompts_per_step * ro.samples_per_prompt
    sglang_tile = 0
    if ro.backend == "sglang":
        if device != "cuda":
            raise RecipeError(f"{recipe.source}: rollout.backend: sglang needs a CUDA GPU (SGLang's engine); this "
                              f"run's device is {device}")
        from detent_rl.kernels.programs.sglang.triton_decode import DEFAULT_SPLIT_TILE
        from detent_rl.rollout.sglang_plugin import split_tile_size
        sglang_tile = split_tile_size(m.commitment) if m.commitment else DEFAULT_SPLIT_TILE
    return ModelSpec(path=str(checkpoint), arm=recipe.run.arm, device=device, dtype=m.dtype,
                     max_context=m.max_context, max_batch=max(ro.max_num_seqs, tr.micro_batch_size, batch, 8),
                     max_num_tokens=max(2048, tr.max_tokens_per_micro_batch or tr.micro_batch_size * m.max_context,
                                        m.max_context, ro.chunk_size),
                     commitment=m.commitment, threads=1 if device == "cpu" else 0, tp_size=m.tp_size,
                     tp_invariant_with=max(m.tp_size, rollout_tp(recipe)) if m.tp_invariant else 0,
                     sglang_tile=sglang_tile)


PLACEMENT_TIMEOUT = 120.0  # s to wait for the placement group's bundles before giving up with the cluster's resources


def rollout_tp(recipe: Recipe) -> int:
    """Each engine's tensor-parallel degree: rollout.tp_size, else model.tp_size."""
    return recipe.rollout.tp_size or recipe.model.tp_size


def group_sizes(recipe: Recipe) -> tuple[int, int]:
    """(rollout workers, trainer workers): each engine's and the trainer's ranks are workers of their group."""
    tp = recipe.model.tp_size
    return recipe.rollout.num_engines * rollout_tp(recipe), (tp if tp > 1 else recipe.train.num_gpus)


def placement_bundles(recipe: Recipe, device: str) -> tuple[list[dict], tuple[int, ...], tuple[int, ...], float,
                                                               float]:
    """(bundles, each engine worker's bundle, each trainer rank's bundle, GPUs an engine worker takes, GPUs a
    trainer rank takes) of `ray.placement`: colocated, one bundle holds the engines and the trainer (on a
    GPU the trainer takes half, the engines share the other half; with several trainer ranks, ZeRO's or
    TP's, one such bundle per rank, a GPU each, the engine workers dealt over them: under TP rank r of
    every engine shares GPU r with trainer rank r); disaggregated, a bundle (a whole GPU) each."""
    engines, ranks = group_sizes(recipe)
    gpu, ro_tp = device == "cuda", rollout_tp(recipe)
    if recipe.ray.placement == "colocated":
        gpus = max(ranks, ro_tp)
        if gpu and gpus > 1:  # a GPU per rank (ZeRO's or TP's): engine rank r on GPU r, or engines dealt over them
            where = tuple(j % ro_tp if ro_tp > 1 else j % gpus for j in range(engines))
            per = max(where.count(b) for b in range(gpus))
            return ([{"CPU": float(where.count(b) + (b < ranks)), "GPU": 1.0} for b in range(gpus)], where,
                    tuple(range(ranks)), 0.5 / per, 0.5)
        bundle = {"CPU": float(engines + ranks), **({"GPU": 1.0} if gpu else {})}
        return [bundle], (0,) * engines, (0,) * ranks, (0.5 / engines if gpu else 0.0), (0.5 if gpu else 0.0)
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if gpu else {})}
    return ([dict(bundle) for _ in range(engines + ranks)], tuple(range(engines)),
            tuple(range(engines, engines + ranks)), float(gpu), float(gpu))


def _placement_group(recipe: Recipe, bundles: list[dict]) -> Any:
    """The run's placement group, reserved: every bundle placed at once (Ray's gang scheduling), or a
    RecipeError naming what could not be placed and what the cluster has."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    pg = placement_group(bundles, strategy="PACK", name=f"detent_rl:{recipe.run.name}:{os.getpid()}")
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise RecipeError(f"{recipe.source}: ray.placement: {recipe.ray.placement} needs the bundles {bundles} "
                          f"(rollout.num_engines: {recipe.rollout.num_engines}); Ray could not place them in "
                          f"{PLACEMENT_TIMEOUT:g} s on a cluster of {ray.cluster_resources()}") from None
    return pg


def rollout_worker(recipe: Recipe) -> type:
    """The rollout worker class of `rollout.backend`: our embedded engine, or SGLang's (rollout/sglang_worker.py)."""
    if recipe.rollout.backend == "sglang":
        from detent_rl.rollout.sglang_worker import SGLangRolloutWorker
        return SGLangRolloutWorker
    return RolloutWorker


def start_workers(recipe: Recipe, setup: RunSetup) -> tuple[WorkerGroup[RolloutWorker], WorkerGroup[TrainerWorker]]:
    """The rollout and trainer groups: Ray actors in one placement group (`ray.placement`), on a cluster at
    ray.address / RAY_ADDRESS or a local Ray this process starts; or with ray.mode: inline the two
    workers in this process."""
    if recipe.ray.mode == "ray":
        import ray
        address = recipe.ray.address or os.environ.get("RAY_ADDRESS")
        bundles, engine_bundles, trainer_bundles, engine_gpus, trainer_gpus = placement_bundles(recipe, setup.device)
        need = {kind: sum(b.get(kind, 0.0) for b in bundles) for kind in ("CPU", "GPU")}
        local = not address and not ray.is_initialized()
        if local:  # the Ray this process is about to start: checked before it starts
            _check_ray_resources(recipe, need, {"CPU": recipe.ray.num_cpus or os.cpu_count() or 1,
                                                "GPU": torch.cuda.device_count() if setup.device == "cuda" else 0})
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if address:
                kwargs["address"] = address
            elif recipe.ray.num_cpus:
                kwargs["num_cpus"] = recipe.ray.num_cpus
            ray.init(**kwargs)
        if not local:
            _check_ray_resources(recipe, need, ray.cluster_resources())
        pg = _placement_group(recipe, bundles)
        return (WorkerGroup(rollout_worker(recipe), setup.rollout_spec, recipe.rollout, size=len(engine_bundles),
                            ray=RayPlacement(num_cpus=1, num_gpus=engine_gpus, placement_group=pg,
                                             bundles=engine_bundles)),
                WorkerGroup(TrainerWorker, setup.spec, recipe.train, size=len(trainer_bundles),
                            ray=RayPlacement(num_cpus=1, num_gpus=trainer_gpus, placement_group=pg,
                                             bundles=trainer_bundles)))
    return (WorkerGroup(rollout_worker(recipe), setup.rollout_spec, recipe.rollout, size=recipe.rollout.num_engines),
            WorkerGroup(TrainerWorker, setup.spec, recipe.train))  # (tensor parallelism needs Ray: config.py)
