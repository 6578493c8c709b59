"""Recipes: YAML -> frozen dataclasses. Every shipped recipe loads; every bad input is refused with
one line naming the file, the key path and the value; overrides reach nested keys; the resolved
recipe saved in a run directory reloads to an equal Recipe."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from detent_rl.config import (RECIPES_DIR, Recipe, RecipeError, load_recipe, parse_overrides, parse_recipe,
                              save_resolved, source_kind)

MINIMAL = """\
run:
  name: t
model:
  builtin: tiny
data:
  source: reasoning_gym:basic_arithmetic
"""


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    """Relative paths resolve against the working directory: make it a fresh one."""
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def recipe_file(tmp_path: Path, extra: str = "", name: str = "r.yaml") -> Path:
    """MINIMAL with the sections of `extra` merged in key by key."""
    def merge(into: dict, new: dict) -> None:
        for k, v in new.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            else:
                into[k] = v
    raw = yaml.safe_load(MINIMAL)
    merge(raw, yaml.safe_load(extra) or {})
    return write(tmp_path, yaml.safe_dump(raw, sort_keys=False), name)


def checkpoint_dir(tmp_path: Path, name: str = "ckpt") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def refused(path: Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(RecipeError) as e:
        load_recipe(path, overrides)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    return msg


# ---- defaults, nesting, shipped recipes ---------------------------------------------------------

def test_defaults_and_nesting(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL))
    assert r.run.name == "t" and r.run.seed == 0 and r.run.arm == "detent" and r.run.on_mismatch == "raise"
    assert r.run.dir == str(tmp_path / "runs" / "t")
    assert r.model.builtin == "tiny" and r.model.path is None and r.model.dtype == "bfloat16"
    assert r.data.split == "train" and r.data.reward == "detent_rl.rewards:gsm8k_numeric"
    assert r.rollout.samples_per_prompt == 4 and r.rollout.top_p == 1.0 and r.rollout.cuda_graphs == "auto"
    assert r.train.steps == 5 and r.train.lr == 1e-6 and r.train.betas == (0.9, 0.999)
    assert r.train.loss.advantage_std is True and r.train.loss.tis_cap is None
    assert r.train.loss.aggregation == "token-mean" and r.train.loss.kl_estimator == "k3"
    assert r.checkpoint.every == 0 and r.checkpoint.keep == 2 and r.eval.every == 0
    assert r.ray.address is None and r.ray.placement == "colocated" and r.log.tensorboard is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.train.steps = 7  # type: ignore[misc]
    hash(r)  # frozen all the way down, task_config included
    assert isinstance(r.train.lr, float) and isinstance(r.rollout.temperature, float)


def test_yaml_dialect(tmp_path):
    """YAML 1.1 would read `on` as true, `1e-6` as a string and `010` as 8."""
    r = load_recipe(write(tmp_path, MINIMAL + "rollout:\n  cuda_graphs: on\n  max_new_tokens: 010\n"
                                              "train:\n  lr: 1e-6\n"))
    assert r.rollout.cuda_graphs == "on" and r.rollout.max_new_tokens == 10 and r.train.lr == 1e-6
    assert "appears twice" in refused(write(tmp_path, MINIMAL + "train:\n  lr: 1.0\n  lr: 2.0\n"))
    assert "line 3: invalid YAML" in refused(write(tmp_path, "run:\n  name: [t\n"))


def test_empty_section_takes_defaults(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL + "eval:\n")).eval.every == 0


@pytest.mark.parametrize("path", sorted(RECIPES_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    overrides = []
    if raw["model"].get("path"):  # a placeholder the user points at their checkpoint
        overrides.append(f"model.path={checkpoint_dir(tmp_path)}")
    if source_kind(raw["data"]["source"]) == "file":  # likewise for a local dataset
        (tmp_path / "data.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
        overrides.append(f"data.source={tmp_path / 'data.jsonl'}")
    if raw["model"].get("commitment"):  # relative to the repository root, where the recipes are run
        overrides.append(f"model.commitment={RECIPES_DIR.parent / raw['model']['commitment']}")
    r = load_recipe(path, overrides)
    assert r.run.name == path.stem
    if path.stem == "r1d_1.5b_bf16_sanity":
        assert r.train.loss.advantage_std is False and r.train.loss.aggregation == "seq-mean-token-sum"
        assert (r.rollout.prompts_per_step, r.rollout.samples_per_prompt) == (64, 8)
        assert (r.train.lr, r.train.lr_schedule) == (1e-6, "constant")
        assert (r.rollout.temperature, r.rollout.top_p) == (1.0, 1.0)
        assert r.train.loss.kl_coef == 0.0 and r.model.dtype == "bfloat16"


def test_default_recipe_is_small_and_offline():
    r = load_recipe(RECIPES_DIR / "grpo_bf16.yaml")
    assert r.model.builtin == "smollm2-135m-instruct" and r.model.dtype == "bfloat16"
    assert r.data.source.startswith("reasoning_gym:")
    assert r.train.steps * r.rollout.prompts_per_step * r.rollout.samples_per_prompt * r.rollout.max_new_tokens <= 4096


# ---- unknown keys and wrong types ---------------------------------------------------------------

@pytest.mark.parametrize("extra, path", [
    ("colour: red\n", "colour"),
    ("train:\n  stpes: 3\n", "train.stpes"),
    ("train:\n  loss:\n    kl_coeff: 0.1\n", "train.loss.kl_coeff"),
])
def test_unknown_key_names_its_path(tmp_path, extra, path):
    msg = refused(recipe_file(tmp_path, extra))
    assert f": {path}: unknown key" in msg


def test_unknown_key_suggests_the_near_one(tmp_path):
    assert "did you mean 'steps'" in refused(recipe_file(tmp_path, "train:\n  stpes: 3\n"))


@pytest.mark.parametrize("extra, path, shown", [
    ("train:\n  lr: fast\n", "train.lr", "expected a number, got 'fast'"),
    ("train:\n  steps: 2.5\n", "train.steps", "expected an integer, got 2.5"),
    ("train:\n  betas: [0.9]\n", "train.betas", "got [0.9]"),
    ("train:\n  betas: [0.9, x]\n", "train.betas[1]", "got 'x'"),
    ("train:\n  lr: .nan\n", "train.lr", "expected a finite number"),
    ("train:\n  loss:\n    aggregation: mean\n", "train.loss.aggregation", "got 'mean'"),
    ("train:\n  loss:\n    tis_cap: big\n", "train.loss.tis_cap", "or null, got 'big'"),
    ("train: 3\n", "train", "expected a mapping"),
    ("rollout:\n  num_blocks: many\n", "rollout.num_blocks", "or null, got 'many'"),
    ("run:\n  name: 5\n", "run.name", "expected a string, got 5"),
    ("data:\n  task_config: 3\n", "data.task_config", "got 3"),
    ("data:\n  task_config: {a: {b: 1}}\n", "data.task_config.a", "got {'b': 1}"),
])
def test_wrong_type_names_path_and_value(tmp_path, extra, path, shown):
    msg = refused(recipe_file(tmp_path, extra))
    assert f": {path}: " in msg and shown in msg, msg


@pytest.mark.parametrize("override, shown", [
    ("log.tensorboard=1", "expected true or false, got 1"),
    ("log.tensorboard=yes", "expected true or false, got 'yes'"),
    ("log.progress='true'", "expected true or false, got 'true'"),
    ("ray.placement=shared", "ray.placement: expected one of 'colocated', 'disaggregated', got 'shared'"),
    ("train.steps=true", "expected an integer, got True"),
    ("rollout.top_k=false", "expected an integer, got False"),
    ("train.lr=true", "expected a number, got True"),
])
def test_bool_and_int_are_strict(tmp_path, override, shown):
    msg = refused(write(tmp_path, MINIMAL), (override,))
    assert shown in msg and f"(from override {override!r})" in msg


def test_int_accepted_for_float(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL), ("rollout.temperature=1", "train.loss.tis_cap=2"))
    assert r.rollout.temperature == 1.0 and isinstance(r.rollout.temperature, float) and r.train.loss.tis_cap == 2.0


def test_missing_required(tmp_path):
    assert ": run.name: required key is missing" in refused(write(tmp_path, "model:\n  builtin: tiny\n"))
    assert ": data.source: required key is missing" in refused(write(tmp_path, MINIMAL.split("data:")[0]))
    assert "expected a mapping of sections" in refused(write(tmp_path, "- a\n- b\n"))
    assert "cannot read" in refused(tmp_path / "absent.yaml")


# ---- overrides ----------------------------------------------------------------------------------

def test_overrides(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL), (
        "train.steps=3", f"run.dir={tmp_path / 'r'}", "rollout.temperature=0.7", "train.loss.kl_coef=0.01",
        "train.loss.advantage_std=false", "train.betas=[0.8, 0.95]", "data.task_config.max_terms=2",
        "data.system_prompt=Be brief.", "rollout.num_blocks=null", "train.steps=4"))
    assert r.train.steps == 4  # the later override wins
    assert r.run.dir == str(tmp_path / "r") and r.rollout.temperature == 0.7
    assert r.train.loss.kl_coef == 0.01 and r.train.loss.advantage_std is False
    assert r.train.betas == (0.8, 0.95) and dict(r.data.task_config) == {"max_terms": 2}
    assert r.data.system_prompt == "Be brief." and r.rollout.num_blocks is None
    assert r.overrides[0] == "train.steps=3"


def test_override_sets_model_path(tmp_path):
    ckpt = checkpoint_dir(tmp_path)
    r = load_recipe(write(tmp_path, MINIMAL), ("model.builtin=null", f"model.path={ckpt}"))
    assert r.model.path == str(ckpt) and r.model.builtin is None


@pytest.mark.parametrize("override, path", [
    ("train.stpes=3", "train.stpes"),
    ("train.loss.kl=0.1", "train.loss.kl"),
    ("nothing.here=1", "nothing"),
    ("train.steps.x=1", "train.steps"),
])
def test_unknown_override_key(tmp_path, override, path):
    msg = refused(write(tmp_path, MINIMAL), (override,))
    assert f": {path}: " in msg and repr(override) in msg


@pytest.mark.parametrize("override", ["train.steps", "=3", "train..steps=3", "train steps=3"])
def test_malformed_override(tmp_path, override):
    msg = refused(write(tmp_path, MINIMAL), (override,))
    assert "expected key.sub=value" in msg and repr(override) in msg


def test_parse_overrides():
    parsed = parse_overrides(["train.steps=3", "run.dir=/tmp/r", "model.path=null", "train.lr=1e-5", "data.split=a=b"])
    assert {k: v for k, (v, _) in parsed.items()} == {
        "train.steps": 3, "run.dir": "/tmp/r", "model.path": None, "train.lr": 1e-5, "data.split": "a=b"}
    with pytest.raises(RecipeError, match=r"^<command line>: override 'steps'"):
        parse_overrides(["steps"])


# ---- cross-field validation ---------------------------------------------------------------------

def test_model_path_and_builtin(tmp_path):
    msg = refused(write(tmp_path, MINIMAL.replace("  builtin: tiny\n", "  dtype: bfloat16\n")))
    assert ": model.path: exactly one of model.path and model.builtin" in msg and "neither" in msg
    ckpt = checkpoint_dir(tmp_path)
    assert "both are set" in refused(write(tmp_path, MINIMAL), (f"model.path={ckpt}",))


def test_missing_model_path(tmp_path):
    p = write(tmp_path, MINIMAL)
    assert refused(p, ("model.builtin=null", "model.path=/x/y")).startswith(f"{p}: model.path: /x/y does not exist")
    (tmp_path / "empty").mkdir()
    msg = refused(p, ("model.builtin=null", "model.path=empty"))
    assert f"model.path: {tmp_path / 'empty'} has no config.json" in msg


def test_relative_paths_resolve_against_cwd(tmp_path):
    checkpoint_dir(tmp_path, "m")
    (tmp_path / "d.jsonl").write_text("{}\n")
    (tmp_path / "t.json").write_text("{}")
    r = load_recipe(write(tmp_path, MINIMAL), ("model.builtin=null", "model.path=m", "data.source=./d.jsonl",
                                               "model.commitment=t.json", "run.dir=out"))
    assert r.model.path == str(tmp_path / "m") and r.data.source == str(tmp_path / "d.jsonl")
    assert r.model.commitment == str(tmp_path / "t.json") and r.run.dir == str(tmp_path / "out")


@pytest.mark.parametrize("source", ["data/missing.jsonl", "/no/such/file.parquet", "./x.json"])
def test_missing_dataset_file(tmp_path, source):
    assert "does not exist" in refused(write(tmp_path, MINIMAL), (f"data.source={source}",))


def test_source_kinds(tmp_path):
    assert source_kind("reasoning_gym:gsm_symbolic") == "reasoning_gym"
    assert source_kind("openai/gsm8k") == "hub" and source_kind("gsm8k") == "hub"
    assert source_kind("data/x.jsonl") == "file" and source_kind("./x") == "file" and source_kind("/a/b") == "file"
    assert source_kind("x.csv") == "file"  # refused later: not a format the data module reads
    (tmp_path / "gsm8k").write_text("")
    assert source_kind("gsm8k") == "file"  # a file that exists is a file


@pytest.mark.parametrize("override, path", [
    ("rollout.temperature=-0.1", "rollout.temperature"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rollout.samples_per_prompt=0", "rollout.samples_per_prompt"),
    ("train.steps=0", "train.steps"),
    ("train.micro_batch_size=0", "train.micro_batch_size"),
    ("train.max_tokens_per_micro_batch=0", "train.max_tokens_per_micro_batch"),
    ("train.max_tokens_per_micro_batch=10", "train.max_tokens_per_micro_batch"),
    ("train.lr=0", "train.lr"),
    ("train.loss.clip_low=-0.1", "train.loss.clip_low"),
    ("train.loss.clip_high=-1", "train.loss.clip_high"),
    ("train.loss.tis_cap=0", "train.loss.tis_cap"),
    ("train.updates_per_batch=1000", "train.updates_per_batch"),
    ("rollout.max_new_tokens=2000", "model.max_context"),
    ("eval.every=5", "eval.every"),
    ("run.name=a/b", "run.name"),
    ("data.reward=gsm8k", "data.reward"),
    ("data.source=reasoning_gym:", "data.source"),
    ("data.source=data.csv", "data.source"),
    ("data.source=a/b/c", "data.source"),
    ("data.split=test", "data.split"),
    ("data.eval_size=256", "data.eval_size"),
    ("rollout.prompts_per_step=300", "rollout.prompts_per_step"),
])
def test_bounds_name_the_key(tmp_path, override, path):
    msg = refused(write(tmp_path, MINIMAL), (override,))
    assert f": {path}: " in msg, msg


@pytest.mark.parametrize("override", ["run.dir=''", "model.path=' '", "data.source=''", "model.commitment=''"])
def test_empty_paths_refused(tmp_path, override):
    assert "must not be empty" in refused(write(tmp_path, MINIMAL), (override, "model.builtin=null"))


def test_whole_section_override_is_named(tmp_path):
    msg = refused(write(tmp_path, MINIMAL), ("train.loss={kl_coef: x}",))
    assert ": train.loss.kl_coef: expected a number, got 'x' (from override 'train.loss={kl_coef: x}')" in msg


def test_hub_source_with_subset_and_split(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL), ("data.source=openai/gsm8k", "data.subset=main", "data.split=test"))
    assert (r.data.source, r.data.subset, r.data.split) == ("openai/gsm8k", "main", "test")
    assert ": data.subset: applies only to a hub dataset" in refused(write(tmp_path, MINIMAL), ("data.subset=main",))


def test_task_config_needs_reasoning_gym(tmp_path):
    msg = refused(write(tmp_path, MINIMAL), ("data.source=openai/gsm8k", "data.task_config.max_terms=2"))
    assert ": data.task_config: only applies to a reasoning_gym source" in msg
    assert ": data.task_config.seed: is data.seed" in refused(write(tmp_path, MINIMAL), ("data.task_config.seed=1",))


# ---- resolved recipe ----------------------------------------------------------------------------

def test_save_resolved_round_trip(tmp_path):
    src = recipe_file(tmp_path, "data:\n  task_config: {operators: ['+', '-'], max_terms: 2}\n", "src.yaml")
    r = load_recipe(src, ("train.steps=3", "rollout.cuda_graphs=off", "data.system_prompt=on"))
    out = save_resolved(r, tmp_path / "runs" / "x")
    assert out == tmp_path / "runs" / "x" / "recipe.yaml"
    assert out.read_text().startswith(f"# resolved from {src} with train.steps=3")
    assert [p.name for p in out.parent.iterdir()] == ["recipe.yaml"]  # no temp file left behind
    os.chdir(tmp_path / "runs")  # absolute paths: reloads the same from anywhere
    again = load_recipe(out)
    assert again == r and again.to_dict() == r.to_dict()
    assert again.rollout.cuda_graphs == "off" and again.data.system_prompt == "on"


def test_to_dict_is_plain_and_parses_back(tmp_path):
    r = load_recipe(write(tmp_path, MINIMAL))
    d = r.to_dict()
    assert list(d) == ["run", "model", "data", "rollout", "train", "checkpoint", "eval", "ray", "log"]
    assert d["train"]["betas"] == [0.9, 0.999] and isinstance(d["data"]["task_config"], dict)
    assert yaml.safe_load(yaml.safe_dump(d)) == d
    assert parse_recipe(d) == r and isinstance(parse_recipe(d), Recipe)
