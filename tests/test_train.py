"""The driver end to end on Ray (CPU, the built-in tiny model): every step bit-equal with KL 0 in the
detent arm and mismatching in the stock arm; a run killed with SIGKILL and resumed reproduces the
uninterrupted run's steps 4-6 exactly; bad recipes fail with one clear line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"step_time_s", "rollout_time_s", "tokens_per_s"}  # wall-clock fields differ between runs

RECIPE = """
run: {{name: t, dir: {dir}, arm: {arm}, device: cpu}}
model: {{builtin: tiny, dtype: bfloat16, max_context: 192}}
data:
  source: reasoning_gym:basic_arithmetic
  task_config: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ["+", "-"],
                allow_parentheses: false, allow_negation: false}}
  size: 24
  max_prompt_tokens: 160
rollout: {{prompts_per_step: 2, samples_per_prompt: 3, max_new_tokens: 12}}
train: {{steps: 6, lr: 1.0e-3, micro_batch_size: 3, updates_per_batch: 2}}
checkpoint: {{every: 3}}
log: {{progress: false, tensorboard: false}}
"""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """One local Ray head for the module's drivers (each connects through RAY_ADDRESS)."""
    tmp = tmp_path_factory.mktemp("ray")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--num-cpus=4",
                          "--include-dashboard=false", f"--temp-dir={tmp}", "--port=0"],
                         env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.fail(f"ray start failed: {out.stderr[-2000:]}")
    address = next((line.split("'")[1] for line in out.stdout.splitlines() if "ray.init(address=" in line
                    or "RAY_ADDRESS" in line and "'" in line), None)
    yield address or "auto"
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], env=env, capture_output=True,
                   timeout=120)


def _recipe(tmp: Path, run_dir: Path, arm: str = "detent") -> Path:
    p = tmp / f"{run_dir.name}.yaml"
    p.write_text(RECIPE.format(dir=run_dir, arm=arm))
    return p


def _driver(recipe: Path, address: str, *extra: str, wait: bool = True) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": address, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "detent_rl.train", str(recipe), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if wait:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
    return proc


def _lines(run_dir: Path, name: str) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / name).read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k not in TIMING} for r in rows}


def test_detent_run_is_bit_equal_stock_is_not_and_inline_equals_ray(tmp_path, ray_cluster):
    runs = {arm: tmp_path / arm for arm in ("detent", "stock")}
    for arm, run_dir in runs.items():
        extra = ["train.steps=2", "checkpoint.every=0"] + (["run.on_mismatch=warn"] if arm == "stock" else [])
        _driver(_recipe(tmp_path, run_dir, arm), ray_cluster, *extra)
    checks = _lines(runs["detent"], "bitcheck.jsonl")
    assert [c["bit_match"] for c in checks.values()] == [1.0, 1.0]
    assert all(c["kl_k1"] == 0.0 and c["kl_k3"] == 0.0 and not c["first_mismatches"] for c in checks.values())
    metrics = _lines(runs["detent"], "metrics.jsonl")
    assert all(m["first_minibatch_ratio_ones"] == 1.0 for m in metrics.values())
    assert all(m["rollout_ratio_min"] == m["rollout_ratio_max"] == 1.0 for m in metrics.values())
    assert "all" in (runs["detent"] / "report.html").read_text() and (runs["detent"] / "recipe.yaml").is_file()
    inline = tmp_path / "inline"  # the same recipe without Ray: workers in the driver's process, same bits
    _driver(_recipe(tmp_path, inline), ray_cluster, "train.steps=2", "checkpoint.every=0", "ray.mode=inline")
    assert _lines(inline, "bitcheck.jsonl") == checks
    assert _lines(inline, "metrics.jsonl") == metrics
    stock = _lines(runs["stock"], "bitcheck.jsonl")  # the negative control: the same loop, mismatching
    assert any(c["bit_match"] < 1.0 and c["kl_k3"] != 0.0 for c in stock.values())
    assert any(m["rollout_ratio_min"] != 1.0 or m["rollout_ratio_max"] != 1.0
               for m in _lines(runs["stock"], "metrics.jsonl").values())
    assert "tokens differ" in (runs["stock"] / "report.html").read_text()


def test_a_killed_run_resumes_to_the_uninterrupted_runs_bits(tmp_path, ray_cluster):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    _driver(_recipe(tmp_path, whole), ray_cluster)
    proc = _driver(_recipe(tmp_path, killed), ray_cluster, wait=False)
    deadline = time.time() + 600
    while not (killed / "checkpoints" / "step_000003").is_dir():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its step-3 checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run, somewhere in step 4
    proc.wait()
    _driver(_recipe(tmp_path, killed), ray_cluster, "--resume")
    for name in ("bitcheck.jsonl", "metrics.jsonl"):
        a, b = _lines(whole, name), _lines(killed, name)
        assert sorted(b) == [1, 2, 3, 4, 5, 6]
        for step in (4, 5, 6):
            assert a[step] == b[step], f"{name} step {step} differs after resume"
    assert _lines(whole, "metrics.jsonl")[6]["weights_sha256"] == _lines(killed, "metrics.jsonl")[6]["weights_sha256"]


@pytest.mark.parametrize("override, message", [
    ("train.stepz=3", "train.stepz"),
    ("train.steps=many", "train.steps"),
    ("model.path=/nonexistent/model", "/nonexistent/model"),
    ("data.source=/nonexistent/data.jsonl", "/nonexistent/data.jsonl"),
])
def test_bad_recipes_fail_with_one_clear_line(tmp_path, override, message):
    recipe = _recipe(tmp_path, tmp_path / "bad")
    extra = ["model.builtin=null"] if override.startswith("model.path") else []
    out = subprocess.run([sys.executable, "-m", "detent_rl.train", str(recipe), override, *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_the_default_recipe_runs_bit_equal_on_a_local_ray(tmp_path):
    """recipes/grpo_bf16.yaml itself (SmolLM2-135M-Instruct, bf16), shortened to one small step."""
    from detent_rl.models.gguf import ModelFetchError, smollm2_checkpoint
    try:
        smollm2_checkpoint()
    except ModelFetchError as e:
        pytest.skip(f"SmolLM2 cannot be fetched here: {e}")
    run_dir = tmp_path / "default"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the recipe's own local Ray
    out = subprocess.run([sys.executable, "-m", "detent_rl.train", str(ROOT / "recipes" / "grpo_bf16.yaml"),
                          f"run.dir={run_dir}", "train.steps=1", "rollout.prompts_per_step=2",
                          "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8", "log.tensorboard=false"],
                         cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (check,) = _lines(run_dir, "bitcheck.jsonl").values()
    assert check["tokens_compared"] > 0 and check["bit_match"] == 1.0 and check["kl_k1"] == 0.0
    assert _lines(run_dir, "metrics.jsonl")[1]["first_minibatch_ratio_ones"] == 1.0
    assert (run_dir / "report.html").is_file()


def test_resuming_from_a_corrupt_checkpoint_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "corrupt"
    broken = run_dir / "checkpoints" / "step_000003"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text("{")
    out = subprocess.run([sys.executable, "-m", "detent_rl.train", str(_recipe(tmp_path, run_dir)), "--resume",
                          "ray.mode=inline", "log.tensorboard=false"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert "step_000003: unreadable manifest.json" in lines[-1] and "not loaded" in lines[-1], out.stderr[-2000:]
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text()
