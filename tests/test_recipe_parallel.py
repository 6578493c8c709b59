"""The recipe's rules for running past one process (detent_rl/recipe_parallel.py): ZeRO ranks, tensor-parallel
degrees, what the placement allows, and the Ray bundles each layout asks for (setup.placement_bundles)."""
from __future__ import annotations

import pytest

from detent_rl.config import load_recipe
from test_config import MINIMAL, _cwd, refused, write  # noqa: F401 (_cwd: the working-directory fixture)


def test_release_memory_needs_a_shared_device(tmp_path):
    msg = refused(write(tmp_path, MINIMAL), ("ray.placement=disaggregated", "rollout.release_memory=true"))
    assert ": rollout.release_memory: " in msg and "disaggregated" in msg, msg
    r = load_recipe(write(tmp_path, MINIMAL), ("rollout.release_memory=true",))
    assert r.rollout.release_memory and r.ray.placement == "colocated"


@pytest.mark.parametrize("overrides, path, shown", [
    (("train.zero_stage=3",), "train.zero_stage", "2 (DeepSpeed ZeRO-2) or null, got 3"),
    (("train.num_gpus=2",), "train.num_gpus", "2 trainer ranks need train.zero_stage: 2"),
    (("train.zero_stage=2", "ray.mode=inline"), "train.zero_stage", "needs ray.mode: ray"),
    (("train.num_gpus=0",), "train.num_gpus", "must be >= 1"),
])
def test_zero_settings_are_checked(tmp_path, overrides, path, shown):
    msg = refused(write(tmp_path, MINIMAL), overrides)
    assert f": {path}: " in msg and shown in msg, msg


@pytest.mark.parametrize("overrides, path, shown", [
    (("model.tp_size=0",), "model.tp_size", "must be >= 1"),
    (("model.tp_size=2", "ray.mode=inline"), "model.tp_size", "needs ray.mode: ray"),
    (("model.tp_size=2", "run.arm=stock"), "model.tp_size", "the stock arm trains with transformers' own model"),
    (("model.tp_size=2", "train.zero_stage=2", "train.num_gpus=2"), "model.tp_size", "not built yet"),
])
def test_tensor_parallel_settings_are_checked(tmp_path, overrides, path, shown):
    msg = refused(write(tmp_path, MINIMAL), overrides)
    assert f": {path}: " in msg and shown in msg, msg


@pytest.mark.parametrize("overrides, bundles, engines, trainer, fractions", [
    ((), [{"CPU": 2.0, "GPU": 1.0}], (0,), (0,), (0.5, 0.5)),
    (("rollout.num_engines=2",), [{"CPU": 3.0, "GPU": 1.0}], (0, 0), (0,), (0.25, 0.5)),
    # two ZeRO ranks, a GPU each, an engine beside each
    (("train.zero_stage=2", "train.num_gpus=2", "rollout.num_engines=2"), [{"CPU": 2.0, "GPU": 1.0}] * 2, (0, 1),
     (0, 1), (0.5, 0.5)),
    # TP 2, two engines: rank r of each engine and of the trainer on GPU r
    (("model.tp_size=2", "rollout.num_engines=2"), [{"CPU": 3.0, "GPU": 1.0}] * 2, (0, 1, 0, 1), (0, 1),
     (0.25, 0.5)),
    (("model.tp_size=2", "ray.placement=disaggregated"), [{"CPU": 1.0, "GPU": 1.0}] * 4, (0, 1), (2, 3), (1.0, 1.0)),
])
def test_gpu_placement_bundles(tmp_path, overrides, bundles, engines, trainer, fractions):
    from detent_rl.setup import placement_bundles
    got = placement_bundles(load_recipe(write(tmp_path, MINIMAL), overrides), "cuda")
    assert got == (bundles, engines, trainer, *fractions)


@pytest.mark.parametrize("overrides, path, shown", [
    (("rollout.tp_size=0",), "rollout.tp_size", "must be >= 1 or null"),
    (("rollout.tp_size=2",), "rollout.tp_size", "unless model.tp_invariant: true"),
    (("model.tp_size=2", "rollout.tp_size=4", "model.tp_invariant=true"), "rollout.tp_size", "between one GPU and N"),
    (("model.tp_invariant=true",), "model.tp_invariant", "needs tensor parallelism"),
    (("model.tp_invariant=true", "model.tp_size=2", "run.arm=det"), "model.tp_invariant", "the run's arm is det"),
    (("model.tp_invariant=true", "model.tp_size=2", "model.commitment=t.json"), "model.tp_invariant",
     "leave model.commitment null"),
    (("rollout.tp_size=2", "model.tp_invariant=true", "ray.mode=inline"), "rollout.tp_size", "needs ray.mode: ray"),
])
def test_tensor_parallel_degrees_are_checked(tmp_path, overrides, path, shown):
    (tmp_path / "t.json").write_text("{}")  # exists: the refusal is tp_invariant's, not the path's
    msg = refused(write(tmp_path, MINIMAL), overrides)
    assert f": {path}: " in msg and shown in msg, msg


def test_the_sglang_backend_is_refused_without_sglang(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    msg = refused(write(tmp_path, MINIMAL), ("rollout.backend=sglang",))
    assert ": rollout.backend: " in msg and "not installed" in msg, msg
    msg = refused(write(tmp_path, MINIMAL), ("rollout.backend=vllm",))
    assert ": rollout.backend: " in msg and "sglang" in msg, msg


@pytest.mark.parametrize("overrides, path, shown", [
    (("run.arm=stock",), "rollout.backend", "pins it to the detent arm's tuple; the run's arm is stock"),
    (("model.tp_size=2", "ray.mode=ray"), "rollout.backend", "one GPU per engine"),
    (("rollout.release_memory=true",), "rollout.release_memory", "not wired to SGLang's engine"),
])
def test_the_sglang_backends_limits_are_checked(tmp_path, monkeypatch, overrides, path, shown):
    import importlib.machinery
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # as if SGLang were installed
                        lambda name, *a: importlib.machinery.ModuleSpec("sglang", None) if name == "sglang"
                        else real(name, *a))
    msg = refused(write(tmp_path, MINIMAL), ("rollout.backend=sglang",) + overrides)
    assert f": {path}: " in msg and shown in msg, msg
    r = load_recipe(write(tmp_path, MINIMAL), ("rollout.backend=sglang",))
    assert r.rollout.backend == "sglang"


def test_the_sglang_backend_needs_a_gpu(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    from detent_rl.config import RecipeError
    from detent_rl.setup import prepare, rollout_worker
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: importlib.machinery.ModuleSpec("sglang", None)
                        if name == "sglang" else real(name, *a))
    r = load_recipe(write(tmp_path, MINIMAL), ("rollout.backend=sglang",))
    assert rollout_worker(r).__name__ == "SGLangRolloutWorker"
    with pytest.raises(RecipeError, match="rollout.backend: sglang needs a CUDA GPU"):
        prepare(r)
