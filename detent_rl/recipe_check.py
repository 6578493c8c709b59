"""A recipe's cross-field rules: the bounds of its numbers, the model and data sources, the limits one section
sets another, and its paths made absolute. Called by `config.parse_recipe` once every field has its type
(`recipe_schema.build`); each refusal is a `RecipeError` naming its key path (`Context.error`). The rules for
running past one process are `recipe_parallel.py`'s.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from detent_rl.recipe_parallel import check_backend, check_parallelism
from detent_rl.recipe_schema import Context, get_path, show

if TYPE_CHECKING:
    from detent_rl.config import Recipe

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")  # the local formats the data module reads
_FILE_LIKE = DATA_SUFFIXES + (".csv", ".tsv", ".txt", ".arrow", ".gz", ".zip")  # refused, not sent to the hub
REASONING_GYM = "reasoning_gym:"


def _positive(v: Any) -> bool:
    return v is None or v >= 1


def _non_negative(v: Any) -> bool:
    return v is None or v >= 0


_BOUNDS = (
    ("model.max_context", _positive, "must be >= 1"),
    ("data.size", _positive, "must be >= 1"),
    ("data.eval_size", _non_negative, "must be >= 0"),
    ("data.seed", _non_negative, "must be >= 0"),
    ("data.max_prompt_tokens", _positive, "must be >= 1"),
    ("run.seed", _non_negative, "must be >= 0"),
    ("rollout.prompts_per_step", _positive, "must be >= 1"),
    ("rollout.samples_per_prompt", _positive, "must be >= 1"),
    ("rollout.max_new_tokens", _positive, "must be >= 1"),
    ("rollout.temperature", _non_negative, "must be >= 0"),
    ("rollout.top_p", lambda v: 0 < v <= 1, "must be in (0, 1]"),
    ("rollout.top_k", _non_negative, "must be >= 0 (0: off)"),
    ("rollout.max_num_seqs", _positive, "must be >= 1"),
    ("rollout.chunk_size", _positive, "must be >= 1"),
    ("rollout.num_blocks", _positive, "must be >= 1 or null"),
    ("rollout.num_engines", _positive, "must be >= 1"),
    ("train.steps", _positive, "must be >= 1"),
    ("train.lr", lambda v: v > 0, "must be > 0"),
    ("train.warmup_steps", _non_negative, "must be >= 0"),
    ("train.weight_decay", _non_negative, "must be >= 0"),
    ("train.betas", lambda v: all(0 <= b < 1 for b in v), "must both be in [0, 1)"),
    ("train.eps", lambda v: v > 0, "must be > 0"),
    ("train.grad_clip", _non_negative, "must be >= 0 (0: off)"),
    ("train.micro_batch_size", _positive, "must be >= 1"),
    ("train.num_gpus", _positive, "must be >= 1"),
    ("model.tp_size", _positive, "must be >= 1"),
    ("rollout.tp_size", lambda v: v is None or v >= 1, "must be >= 1 or null"),
    ("train.max_tokens_per_micro_batch", lambda v: v is None or v >= 1, "must be >= 1 or null"),
    ("train.updates_per_batch", _positive, "must be >= 1"),
    ("train.loss.clip_low", lambda v: 0 <= v < 1, "must be in [0, 1) (the ratio floor is 1 - clip_low)"),
    ("train.loss.clip_high", _non_negative, "must be >= 0"),
    ("train.loss.kl_coef", _non_negative, "must be >= 0"),
    ("train.loss.tis_cap", lambda v: v is None or v > 0, "must be > 0 or null"),
    ("checkpoint.every", _non_negative, "must be >= 0 (0: never)"),
    ("checkpoint.keep", _positive, "must be >= 1"),
    ("eval.every", _non_negative, "must be >= 0 (0: never)"),
    ("ray.num_cpus", _positive, "must be >= 1 or null"),
)


def validate(r: "Recipe", ctx: Context) -> "Recipe":
    """The cross-field rules and bounds of a recipe whose every field has its type; each refusal names its key path."""
    for path, ok, rule in _BOUNDS:
        value = get_path(r, path)
        if not ok(value):
            raise ctx.error(path, f"{rule}, got {show(value)}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", r.run.name):
        raise ctx.error("run.name", f"must be a plain directory name (letters, digits, . _ -), got {show(r.run.name)}")
    m, d = r.model, r.data
    if (m.path is None) == (m.builtin is None):
        both = "both are set" if m.path else "neither is set"
        raise ctx.error("model.path", f"exactly one of model.path and model.builtin must be set ({both})")
    if m.path is not None:
        if not Path(m.path).is_dir():
            raise ctx.error("model.path", f"{m.path} does not exist" if not Path(m.path).exists()
                            else f"{m.path} is not a directory")
        if not (Path(m.path) / "config.json").is_file():
            raise ctx.error("model.path", f"{m.path} has no config.json")
    if m.commitment is not None and not Path(m.commitment).is_file():
        raise ctx.error("model.commitment", f"{m.commitment} does not exist")
    if m.commitment is not None and r.run.arm != "detent":
        raise ctx.error("model.commitment", f"a commitment tuple pins the detent arm; run.arm is {r.run.arm!r}, "
                                            f"which would ignore it (set run.arm: detent, or model.commitment: null)")
    kind = source_kind(d.source)
    if kind == "file":
        if Path(d.source).suffix not in DATA_SUFFIXES:
            raise ctx.error("data.source", f"{d.source}: a local dataset must be {', '.join(DATA_SUFFIXES)}")
        if not Path(d.source).is_file():
            raise ctx.error("data.source", f"{d.source} does not exist")
    elif kind == "reasoning_gym" and not re.fullmatch(r"\w+", d.source[len(REASONING_GYM):]):
        raise ctx.error("data.source", f"expected reasoning_gym:<task>, got {show(d.source)}")
    elif kind == "hub" and not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", d.source):
        raise ctx.error("data.source", f"expected reasoning_gym:<task>, a .jsonl/.json/.parquet path or a "
                                       f"hub dataset id such as openai/gsm8k, got {show(d.source)}")
    if d.subset is not None and kind != "hub":
        raise ctx.error("data.subset", f"applies only to a hub dataset, not {show(d.source)}")
    if kind != "hub" and d.split != "train":
        raise ctx.error("data.split", f"a {kind} source has only the split 'train', got {show(d.split)}")
    if d.task_config and kind != "reasoning_gym":
        raise ctx.error("data.task_config", f"only applies to a reasoning_gym source, not {show(d.source)}")
    for key in ("size", "seed"):
        if key in d.task_config:
            raise ctx.error(f"data.task_config.{key}", f"is data.{key}; set it there")
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", d.reward):
        raise ctx.error("data.reward", f"expected an import path module:function, got {show(d.reward)}")
    for key in ("split", "question_key", "answer_key"):
        if not getattr(d, key):
            raise ctx.error(f"data.{key}", "must not be empty")
    need = d.max_prompt_tokens + r.rollout.max_new_tokens
    if need > m.max_context:
        raise ctx.error("model.max_context", f"{m.max_context} is less than data.max_prompt_tokens + "
                                             f"rollout.max_new_tokens = {need}")
    budget = r.train.max_tokens_per_micro_batch
    if budget is not None and budget < need:
        raise ctx.error("train.max_tokens_per_micro_batch", f"{budget} cannot hold the longest sequence, "
                        f"data.max_prompt_tokens + rollout.max_new_tokens = {need} (a sequence is one forward)")
    if d.eval_size >= d.size:
        raise ctx.error("data.eval_size", f"{d.eval_size} leaves none of data.size {d.size} to train on")
    if r.rollout.prompts_per_step > d.size - d.eval_size:
        raise ctx.error("rollout.prompts_per_step", f"{r.rollout.prompts_per_step} is more than the "
                        f"{d.size - d.eval_size} training tasks (data.size - data.eval_size)")
    batch = r.rollout.prompts_per_step * r.rollout.samples_per_prompt
    if r.train.updates_per_batch > batch:
        raise ctx.error("train.updates_per_batch", f"{r.train.updates_per_batch} minibatches from a batch of "
                                                   f"{batch} sequences (prompts_per_step x samples_per_prompt)")
    if r.eval.every and not d.eval_size:
        raise ctx.error("eval.every", f"{r.eval.every} needs data.eval_size >= 1")
    if r.ray.mode == "inline" and r.ray.weight_sync != "auto":
        raise ctx.error("ray.weight_sync", f"{r.ray.weight_sync} needs ray.mode: ray (inline, the engines take the "
                                           f"trainer's tensors in its own process); leave it auto")
    if r.ray.address is not None and not r.ray.address.strip():
        raise ctx.error("ray.address", "must not be empty (null: RAY_ADDRESS or a local Ray)")
    check_parallelism(r, ctx)
    check_backend(r, ctx)
    return r


def source_kind(source: str) -> Literal["reasoning_gym", "file", "hub"]:
    """How `data.source` is read. A local file exists, or has a data-file suffix, or starts with / . ~;
    anything else is a hub dataset id (data.load_tasks draws the same line for any source that passes);
    `owner/name` holds a '/' too, so a '/' alone decides nothing."""
    if source.startswith(REASONING_GYM):
        return "reasoning_gym"
    if source.lower().endswith(_FILE_LIKE) or source.startswith(("/", ".", "~")) or os.path.exists(source):
        return "file"
    return "hub"


def resolve_paths(r: "Recipe", ctx: Context) -> "Recipe":
    """Every path value made absolute against the working directory (`run.dir` defaulting to runs/<run.name>)."""
    def absolute(path: str, p: Optional[str]) -> Optional[str]:
        if p is not None and not p.strip():
            raise ctx.error(path, "must not be empty (null for the default)")
        return None if p is None else os.path.abspath(os.path.expanduser(p))

    default_dir = os.path.join("runs", r.run.name)
    run = dataclasses.replace(r.run, dir=absolute("run.dir", default_dir if r.run.dir is None else r.run.dir))
    model = dataclasses.replace(r.model, path=absolute("model.path", r.model.path),
                                commitment=absolute("model.commitment", r.model.commitment))
    data = r.data
    if not data.source.strip():
        raise ctx.error("data.source", "must not be empty")
    if source_kind(data.source) == "file":
        data = dataclasses.replace(data, source=absolute("data.source", data.source))
    return dataclasses.replace(r, run=run, model=model, data=data)


