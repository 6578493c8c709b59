"""The recipe's rules for running past one process: ZeRO ranks, tensor-parallel degrees, placement, and
the rollout backend (SGLang's engine runs in processes of its own).

Called by `recipe_check.validate` once each field is valid on its own; each refusal names its key path.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from detent_rl.recipe_schema import Context, show

if TYPE_CHECKING:
    from detent_rl.config import Recipe


def check_parallelism(r: "Recipe", ctx: Context) -> None:
    """ZeRO (`train.zero_stage`, `train.num_gpus`), tensor parallelism (`model.tp_size`, `rollout.tp_size`,
    `model.tp_invariant`) and what the placement allows (`rollout.release_memory`)."""
    m = r.model
    tr = r.train
    if tr.zero_stage not in (None, 2):
        raise ctx.error("train.zero_stage", f"2 (DeepSpeed ZeRO-2) or null, got {show(tr.zero_stage)}: stage 3 "
                                            f"gathers weights in module hooks the pinned forward does not run through")
    if tr.num_gpus > 1 and tr.zero_stage is None:
        raise ctx.error("train.num_gpus", f"{tr.num_gpus} trainer ranks need train.zero_stage: 2 (DeepSpeed ZeRO-2)")
    if tr.zero_stage is not None:
        if r.ray.mode != "ray":
            raise ctx.error("train.zero_stage", "the ZeRO ranks are Ray actors: it needs ray.mode: ray")
        if r.run.arm == "stock":
            raise ctx.error("train.zero_stage", "the stock arm trains with transformers' own trainer; leave it null")
    ro_tp = r.rollout.tp_size or m.tp_size
    if max(m.tp_size, ro_tp) > 1:
        key = "model.tp_size" if m.tp_size > 1 else "rollout.tp_size"
        degree = max(m.tp_size, ro_tp)
        if r.ray.mode != "ray":
            raise ctx.error(key, f"{degree} ranks are Ray actors (a process each): it needs ray.mode: ray")
        if r.run.arm == "stock":
            raise ctx.error(key, "the stock arm trains with transformers' own model on one device; "
                                 "tensor parallelism runs the detent, det and corun arms")
        if tr.zero_stage is not None:
            raise ctx.error(key, "with train.zero_stage: tensor parallelism inside ZeRO's data "
                                 "parallelism is not built yet; use one of them")
    if ro_tp != m.tp_size:
        if not m.tp_invariant:
            raise ctx.error("rollout.tp_size", f"{ro_tp} engine ranks against model.tp_size {m.tp_size} trainer ranks: "
                                               f"bits differ across degrees unless model.tp_invariant: true")
        if min(ro_tp, m.tp_size) != 1:
            raise ctx.error("rollout.tp_size", f"{ro_tp} engine ranks against {m.tp_size} trainer ranks: bits equal "
                                               f"across degrees between one GPU and N ranks only")
    if m.tp_invariant:
        if max(m.tp_size, ro_tp) == 1:
            raise ctx.error("model.tp_invariant", "needs tensor parallelism (model.tp_size or rollout.tp_size > 1)")
        if r.run.arm != "detent":
            raise ctx.error("model.tp_invariant", "commits the detent arm's K partitions; "
                                                  f"the run's arm is {r.run.arm}")
        if m.commitment is not None:
            raise ctx.error("model.tp_invariant", "derives its commitment tuples (models/tp_invariant.py); "
                                                  "leave model.commitment null")
    if r.rollout.release_memory and r.ray.mode == "ray" and r.ray.placement != "colocated":
        raise ctx.error("rollout.release_memory", "frees the engines' memory for a trainer on the same device; "
                                                  "with ray.placement: disaggregated they share none")


def check_backend(r: "Recipe", ctx: Context) -> None:
    """`rollout.backend: sglang`: a supported SGLang installed (0.5.17 or 0.5.23), the detent arm (the plugin
    pins SGLang to the trainer's tuple), one GPU per engine and trainer, no memory release (SGLang's own is
    not wired)."""
    ro = r.rollout
    if ro.backend != "sglang":
        return
    import importlib.util
    if importlib.util.find_spec("sglang") is None:
        raise ctx.error("rollout.backend", "sglang needs SGLang 0.5.17 or 0.5.23 and its CUDA kernels installed "
                                           "(pip install 'detent_rl[sglang]' on a CUDA machine); it is not "
                                           "installed")
    if r.run.arm != "detent":
        raise ctx.error("rollout.backend", f"sglang runs under detent_rl's plugin, which pins it to the detent arm's "
                                           f"tuple; the run's arm is {r.run.arm}")
    if max(r.model.tp_size, ro.tp_size or 1) > 1 or r.train.zero_stage is not None:
        raise ctx.error("rollout.backend", "sglang: one GPU per engine and an unsharded trainer (tensor parallelism "
                                           "and ZeRO are not wired to SGLang's engine yet)")
    if ro.release_memory:
        raise ctx.error("rollout.release_memory", "not wired to SGLang's engine (its own memory release); "
                                                  "leave it false with rollout.backend: sglang")
