"""Recipes: a YAML file (plus `key.sub=value` overrides) -> one frozen `Recipe`, validated on load.

Invariants a loaded `Recipe` keeps:
- Every key was known and every value had its annotated type. bool takes only true/false, int never
  takes a bool, float takes ints (stored as float) and must be finite, tuples have their exact length.
- Path values are absolute: `model.path`, `model.commitment`, a local `data.source` and `run.dir` are
  resolved against the current working directory at load (not the recipe file's folder, so a path
  on the command line and one in the file mean the same thing). `run.dir` defaults to runs/<run.name>.
  Hence the resolved recipe saved in a run directory reloads to an equal Recipe from anywhere.
- Cross-field rules hold (`recipe_check.validate`): exactly one of model.path / model.builtin; the model
  directory has a config.json; a local dataset file exists; counts are positive; ranges are sane.
Every bad input raises `RecipeError` with one line: `<recipe file>: <key path>: <what is wrong>`.
Nothing here is written back after load: values derived at run time belong in runtime state.

The YAML dialect and the type checking live in `recipe_schema.py`: YAML 1.2's core scalars (only
true/false are booleans, so `cuda_graphs: on` stays the string 'on'; `1e-6` is a float; dates stay
strings) and a key given twice is an error.
The dataset, reward and reasoning_gym task names are only checked for form here; the data module
imports them (importing reasoning_gym alone takes seconds).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Optional, Sequence

import yaml

from detent_rl import atomic
from detent_rl.recipe_check import DATA_SUFFIXES, resolve_paths, source_kind, validate
from detent_rl.recipe_schema import (Context, Loader, RecipeError, build, copy_raw, parse_overrides, plain,
                                     schema_fields, set_override, show)

__all__ = ["DATA_SUFFIXES", "RECIPES_DIR", "Recipe", "RecipeError", "load_recipe", "parse_overrides", "parse_recipe",
           "save_resolved", "source_kind"]

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"  # present in a source checkout


@dataclass(frozen=True)
class RunSection:
    name: str  # names the run; the default run directory is runs/<name>
    dir: Optional[str] = None  # run directory (checkpoints, reports, recipe.yaml); None -> runs/<name>
    seed: int = 0  # seeds sampling and training
    arm: Literal["stock", "det", "detent"] = "detent"  # kernel selection arm (DESIGN.md)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    on_mismatch: Literal["raise", "warn"] = "raise"  # a trainer logprob differing from the rollout's


@dataclass(frozen=True)
class ModelSection:
    path: Optional[str] = None  # HF checkpoint directory (config.json + safetensors)
    # or a named built-in model
    builtin: Optional[Literal["tiny", "tiny-qwen2", "smollm2-135m-instruct", "qwen2-0.5b", "qwen2-1.5b"]] = None
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    max_context: int = 1024  # prompt + completion tokens the engine admits per sequence
    commitment: Optional[str] = None  # commitment-tuple JSON from the tuner; None: the arm's defaults
    tp_size: int = 1  # tensor-parallel ranks of the trainer, and of each engine unless rollout.tp_size
    # bits equal across TP degrees (models/tp_invariant.py), so engines and trainer may differ (one of them 1)
    tp_invariant: bool = False


@dataclass(frozen=True)
class DataSection:
    source: str  # "reasoning_gym:<task>", a local .jsonl/.json/.parquet file, or a hub dataset id
    subset: Optional[str] = None  # a hub dataset's configuration, e.g. "main" for openai/gsm8k; hub only
    split: str = "train"  # only "train" for reasoning_gym and local files
    question_key: str = "question"  # record field holding the prompt text
    answer_key: str = "answer"  # record field holding the reference answer the reward reads
    size: int = 256  # tasks generated (reasoning_gym) or the first records taken (files, hub)
    eval_size: int = 0  # of those, held out for eval
    seed: int = 0  # reasoning_gym generation seed
    task_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # ^ keyword arguments for reasoning_gym.create_dataset (difficulty knobs), scalars or lists
    template: Literal["chat", "plain"] = "chat"  # chat: the tokenizer's chat template; plain: raw text
    system_prompt: Optional[str] = None  # None: the chat template's own default
    prompt_suffix: str = "\nGive the final answer as a number after '####'."  # appended to each question
    reward: str = "detent_rl.rewards:gsm8k_numeric"  # import path module:function(completion, task) -> float
    max_prompt_tokens: int = 256  # a task whose rendered prompt is longer is dropped


@dataclass(frozen=True)
class RolloutSection:
    prompts_per_step: int = 8
    samples_per_prompt: int = 4  # the GRPO group size
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_num_seqs: int = 64  # sequences the engine batches at once
    chunk_size: int = 256  # chunked-prefill tokens per step
    num_blocks: Optional[int] = None  # KV-cache blocks; None: sized from free memory
    cuda_graphs: Literal["auto", "on", "off"] = "auto"  # decode graphs; auto: on on the GPU (every arm)
    # prefill and mixed steps through CUDA graphs at padded sizes; auto: whole where the decode graphs are captured
    # (the GPU, embedded engine): one graph of the whole step a padded size, attention inside (rollout/full_steps.py);
    # on: the pieces between the attention calls (rollout/step_graphs.py); true/false read as on/off
    step_graphs: Literal["auto", "on", "off", "whole"] = "auto"
    # compile every kernel variant a step can launch and capture every decode graph when the engine starts
    # (`Engine.warmup`), so that no rollout step stalls on a compile; auto: on on the GPU (the CPU compiles nothing)
    warmup: Literal["auto", "on", "off"] = "auto"
    num_engines: int = 1  # engine replicas (data parallel): each prompt's group on one, dealt round-robin
    release_memory: bool = False  # colocated: engines free their KV cache in updates (rollout/vmm.py)
    tp_size: Optional[int] = None  # tensor-parallel ranks of each engine; null: model.tp_size
    # sglang: SGLang's engine under the plugin (rollout/sglang_worker.py)
    backend: Literal["embedded", "sglang"] = "embedded"

    def graphs(self) -> Optional[bool]:
        """The embedded engine's `cuda_graphs` argument: decode through CUDA graphs (None, auto: on a CUDA device)."""
        return {"auto": None, "on": True, "off": False}[self.cuda_graphs]

    def pieces(self, device: str) -> bool:
        """Whether the embedded engine on `device` runs its prefill and mixed steps through the piecewise step
        graphs: `step_graphs`, where auto is on where the decode graphs are captured (on the GPU, unless
        `cuda_graphs` is off). On the H200 (Qwen2-0.5B, sessions 35-36, docs/BENCHMARKS.md) they took online
        serving's p50 per output token to 0.34-0.37x in every arm and left the GRPO batch at 0.95-1.00x of its
        time; their graph pool holds ~2.2 GB more at 8,192 tokens a step, and the warm-up takes ~1 s longer."""
        if self.step_graphs != "auto":
            return self.step_graphs in ("on", "whole")
        return device == "cuda" and self.cuda_graphs != "off"

    def whole(self, device: str) -> bool:
        """Whether the embedded engine's step graphs on `device` are whole-step graphs (the engine's `full_steps`):
        each step one graph, attention inside; the pieces then serve only the steps they do not take. `whole`, or
        auto where the step graphs are on. On an H100 (docs/BENCHMARKS.md, session 50) they took online serving's
        p50 per output token to 0.91-0.92x of the pieces' in every arm and left the GRPO batch at 1.00x."""
        return self.step_graphs == "whole" or (self.step_graphs == "auto" and self.pieces(device))


@dataclass(frozen=True)
class LossSection:
    advantage_std: bool = True  # divide advantages by the group std (GRPO); False: Dr.GRPO
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high] (DAPO's clip-higher)
    clip_high: float = 0.28
    aggregation: Literal["token-mean", "seq-mean-token-sum"] = "token-mean"
    kl_coef: float = 0.0  # 0: no reference model
    kl_estimator: Literal["k1", "k3"] = "k3"
    tis_cap: Optional[float] = None  # truncated importance sampling cap; None: off


@dataclass(frozen=True)
class TrainSection:
    steps: int = 5  # rollout + update steps
    lr: float = 1e-6
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"  # after warmup, decaying to 0
    warmup_steps: int = 0  # linear warmup from 0, in optimiser steps
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW
    eps: float = 1e-8  # AdamW
    grad_clip: float = 1.0  # max global grad norm; 0: off
    micro_batch_size: int = 8  # sequences per forward/backward, at most
    # tokens (prompt + completion) per forward/backward, at most: sequences are packed in order until
    # the next would pass it (long completions: a budget, not a count). The deployment's step is sized
    # for it (at least model.max_context); null: micro_batch_size sequences of model.max_context
    max_tokens_per_micro_batch: Optional[int] = None
    activation_checkpointing: bool = False  # keep each layer's input only; recompute the layer in the backward
    # with updates_per_batch 1: bit-check the update's own forward (it runs on the rollout's weights)
    # instead of a separate rescore pass; more minibatches always rescore first (the later ones'
    # forwards run on updated weights, so only a rescore checks every token)
    free_bitcheck: bool = True
    updates_per_batch: int = 1  # optimiser steps per rollout batch (it is split into that many minibatches)
    # with more than one update per batch, GRPO's logp_old: "rescore" (a pass over the batch before the
    # first update: every token bit-checked) or "rollout" (the rollout's own logprobs, no rescore pass:
    # only the first minibatch's tokens are checked, by its update's forward, which runs on the
    # rollout's weights; the later minibatches' forwards run on updated weights and check nothing)
    old_logprobs: Literal["rescore", "rollout"] = "rescore"
    # DeepSpeed ZeRO: null, our own trainer (one rank); 2, ZeRO-2 over `num_gpus` trainer ranks (Ray actors:
    # the gradients reduced, the fp32 masters and AdamW's state partitioned; the forward's bits unchanged)
    zero_stage: Optional[int] = None
    num_gpus: int = 1  # trainer ranks (a GPU each; processes on the CPU); more than one needs zero_stage 2
    loss: LossSection = field(default_factory=LossSection)


@dataclass(frozen=True)
class CheckpointSection:
    every: int = 0  # save every N steps; 0: never
    keep: int = 2  # newest checkpoints kept


@dataclass(frozen=True)
class EvalSection:
    every: int = 0  # evaluate on data.eval_size held-out tasks every N steps; 0: never


@dataclass(frozen=True)
class RaySection:
    # ray: the two workers are Ray actors (own processes); inline: plain objects in the driver's
    # process (one device, no Ray needed; the same calls, the same bits)
    mode: Literal["ray", "inline"] = "ray"
    address: Optional[str] = None  # None: honour RAY_ADDRESS, else start a local Ray
    # one Ray placement group: colocated, engines and trainer share a bundle (a GPU per trainer rank, half
    # each; setup.placement_bundles); disaggregated, each engine and trainer rank a bundle (a GPU) of its own
    placement: Literal["colocated", "disaggregated"] = "colocated"
    # how the weights reach the engines: auto (CUDA IPC on a shared GPU, a collective between GPUs, else
    # host copies through Ray), or one of host, ipc, collective (a torch.distributed broadcast from the
    # trainer: NCCL between GPUs, gloo on the CPU)
    weight_sync: Literal["auto", "host", "ipc", "collective"] = "auto"
    num_cpus: Optional[int] = None  # for a local ray.init; None: Ray's default


@dataclass(frozen=True)
class LogSection:
    tensorboard: bool = True
    progress: bool = True  # a progress line per step


@dataclass(frozen=True)
class Recipe:
    run: RunSection
    model: ModelSection
    data: DataSection
    rollout: RolloutSection = field(default_factory=RolloutSection)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    eval: EvalSection = field(default_factory=EvalSection)
    ray: RaySection = field(default_factory=RaySection)
    log: LogSection = field(default_factory=LogSection)
    source: str = field(default="<dict>", compare=False)  # provenance only: the file it came from
    overrides: tuple[str, ...] = field(default=(), compare=False)  # provenance only

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-safe data (lists for tuples, dicts for mappings), sections in schema order."""
        return {f.name: plain(getattr(self, f.name)) for f in schema_fields(Recipe)}


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read, override, type-check and validate a recipe file."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise RecipeError(f"{source}: cannot read the recipe ({e.strerror or e})") from e
    try:
        raw = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise RecipeError(f"{source}: {where}invalid YAML ({getattr(e, 'problem', None) or e})") from e
    return parse_recipe(raw, source=source, overrides=overrides)


def parse_recipe(raw: Any, source: str = "<dict>", overrides: Sequence[str] = ()) -> Recipe:
    """`load_recipe` on data already parsed (e.g. `Recipe.to_dict()` of another recipe)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise RecipeError(f"{source}: expected a mapping of sections, got {show(raw)}")
    raw = copy_raw(raw)
    origin = {}  # key path -> the override that set it, for error messages
    for key, (value, text) in parse_overrides(overrides, source).items():
        set_override(Recipe, raw, key, value, text, source)
        origin[key] = text
    ctx = Context(source, origin)
    recipe = build(Recipe, raw, "", ctx)
    recipe = dataclasses.replace(recipe, source=source, overrides=tuple(overrides))
    return validate(resolve_paths(recipe, ctx), ctx)


def save_resolved(recipe: Recipe, run_dir: str | Path) -> Path:
    """Write `run_dir/recipe.yaml` atomically (a reader never sees half a file)."""
    run_dir = Path(run_dir)
    out = run_dir / "recipe.yaml"
    header = f"# resolved from {recipe.source}" + (f" with {' '.join(recipe.overrides)}" if recipe.overrides else "")
    atomic.write_text(out, header.replace("\n", " ") + "\n"
                      + yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True))
    return out
