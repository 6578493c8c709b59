"""The driver end to end (CPU, the built-in tiny model): on a local Ray that the driver itself starts
and stops (no test touches any other Ray), every step bit-equal with KL 0 in the detent arm, and the
in-process run equal to it; the stock arm stops at its first mismatch and still writes its report;
a run killed with SIGKILL and resumed reproduces the uninterrupted run's steps 4-6 exactly; resume
problems and bad recipes fail with one clear line before any worker starts."""
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
# wall-clock fields differ between runs, and so does the placement's transport
TIMING = {"step_time_s", "rollout_time_s", "tokens_per_s", "weight_sync_s", "reward_time_s", "rescore_time_s",
          "train_time_s", "weight_sync", "checkpoint_time_s"}

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
ray: {{num_cpus: 2}}
"""


def _recipe(tmp: Path, run_dir: Path, arm: str = "detent") -> Path:
    p = tmp / f"{run_dir.name}.yaml"
    p.write_text(RECIPE.format(dir=run_dir, arm=arm))
    return p


def _driver(recipe: Path, *extra: str, wait: bool = True, rc: int = 0) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the driver's own local Ray
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen([sys.executable, "-m", "detent_rl.train", str(recipe), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    if wait:
        proc.out, proc.err = proc.communicate(timeout=600)
        assert proc.returncode == rc, proc.out[-3000:] + proc.err[-3000:]
    return proc


def _lines(run_dir: Path, name: str) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / name).read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k not in TIMING} for r in rows}


def assert_resume_repeats(tmp: Path, whole: Path, rows: dict[int, dict], *extra: str) -> None:
    """A run resumed from `whole`'s step-3 checkpoint (recipe overrides `extra`) repeats its steps 4-6:
    the same weight digests, every step bit-equal."""
    resumed = tmp / "resumed"
    _driver(_recipe(tmp, resumed), *extra, "--resume", str(whole / "checkpoints" / "step_000003"))
    again = _lines(resumed, "metrics.jsonl")
    for step in (4, 5, 6):
        assert again[step]["weights_digest"] == rows[step]["weights_digest"], step
        assert again[step]["bit_match"] == 1.0


@pytest.fixture(scope="module")
def inline2(tmp_path_factory) -> Path:
    """The in-process run of the recipe, 2 steps without checkpoints: the reference three tests compare their Ray,
    replica and placement runs against (one run, made once)."""
    tmp = tmp_path_factory.mktemp("inline2")
    _driver(_recipe(tmp, tmp / "inline"), "train.steps=2", "checkpoint.every=0", "ray.mode=inline")
    return tmp / "inline"


@pytest.fixture(scope="module")
def inline6(tmp_path_factory) -> Path:
    """The in-process run of the recipe, all 6 steps with its checkpoints every 3: the uninterrupted run the kill
    and dead-engine tests resume against (one run, made once; no test writes into it)."""
    tmp = tmp_path_factory.mktemp("inline6")
    _driver(_recipe(tmp, tmp / "whole"), "ray.mode=inline")
    return tmp / "whole"


def test_detent_run_is_bit_equal_stock_stops_with_a_report_and_inline_equals_ray(tmp_path, inline2):
    ray_run, inline, stock = tmp_path / "ray", inline2, tmp_path / "stock"
    _driver(_recipe(tmp_path, ray_run), "train.steps=2", "checkpoint.every=0")
    checks = _lines(ray_run, "bitcheck.jsonl")
    assert [c["bit_match"] for c in checks.values()] == [1.0, 1.0]
    assert all(c["kl_k1"] == 0.0 and c["kl_k3"] == 0.0 and not c["first_mismatches"] for c in checks.values())
    metrics = _lines(ray_run, "metrics.jsonl")
    assert all(m["first_minibatch_ratio_ones"] == 1.0 for m in metrics.values())
    assert all(m["rollout_ratio_min"] == m["rollout_ratio_max"] == 1.0 for m in metrics.values())
    assert "all" in (ray_run / "report.html").read_text() and (ray_run / "recipe.yaml").is_file()
    samples = [json.loads(x) for x in (ray_run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [1] * 6 + [2] * 6
    # the same recipe without Ray: workers in the driver's process, the same bits
    assert _lines(inline, "bitcheck.jsonl") == checks
    assert _lines(inline, "metrics.jsonl") == metrics
    assert (inline / "commitment.json").read_bytes() == (ray_run / "commitment.json").read_bytes()
    # the negative control: the same loop in the stock arm stops at step 1, and says where its report is
    proc = _driver(_recipe(tmp_path, stock, "stock"), "ray.mode=inline", rc=2)
    (line,) = proc.err.strip().splitlines()
    assert "bit-check failed at step 1" in line and f"report: {stock / 'report.html'}" in line, line
    (check,) = _lines(stock, "bitcheck.jsonl").values()
    assert check["bit_match"] < 1.0 and check["kl_k3"] != 0.0
    assert "tokens differ" in (stock / "report.html").read_text()
    # and with the free bit-check (one update per batch: the update's own forward is checked)
    proc = _driver(_recipe(tmp_path, tmp_path / "stock1", "stock"), "ray.mode=inline", "train.updates_per_batch=1",
                   rc=2)
    assert "bit-check failed at step 1" in proc.err
    (check,) = _lines(tmp_path / "stock1", "bitcheck.jsonl").values()
    assert check["bit_match"] < 1.0


def test_engine_replicas_leave_every_request_its_bits(tmp_path, inline2):
    """Data-parallel rollout: with 2 and 3 engine replicas (each prompt's group dealt whole to one) every
    step's samples, bit-check and metrics equal the one-engine run's, in-process and with 2 engines
    as Ray actors whose weights come by a torch.distributed broadcast from the trainer (gloo here;
    each engine checks the trainer's digest). (The stock control is tests/test_dp_rollout.py's: this
    tiny model's CPU kernels round a row alike for every row count the split leaves, so its stock
    rollout does not move.)"""
    want = {name: _lines(inline2, name) for name in ("bitcheck.jsonl", "metrics.jsonl", "samples.jsonl")}
    assert [c["bit_match"] for c in want["bitcheck.jsonl"].values()] == [1.0, 1.0]
    for n, mode in ((2, "inline"), (3, "inline"), (2, "ray")):
        run = tmp_path / f"dp{n}{mode}"
        sync = ["ray.weight_sync=collective"] if mode == "ray" else []
        _driver(_recipe(tmp_path, run), "train.steps=2", "checkpoint.every=0", f"ray.mode={mode}",
                f"rollout.num_engines={n}", "ray.num_cpus=3", *sync)
        for name, rows in want.items():
            assert _lines(run, name) == rows, (n, mode, name)
        transport = {json.loads(x)["weight_sync"] for x in (run / "metrics.jsonl").read_text().splitlines()}
        assert transport == {"collective" if mode == "ray" else "device"}


def test_placement_groups_colocated_and_disaggregated_keep_every_bit(tmp_path, inline2):
    """`ray.placement`: the workers are Ray actors in one placement group — colocated, every engine and
    the trainer in bundle 0; disaggregated, a bundle each — and each run equals the in-process run's
    steps, the colocated one with its engines' KV cache freed around every update. (On a GPU the
    bundles are GPUs: one shared, or one each.)"""
    want = {name: _lines(inline2, name) for name in ("bitcheck.jsonl", "metrics.jsonl", "samples.jsonl")}
    for placement, bundles in (("colocated", [0, 0, 0]), ("disaggregated", [0, 1, 2])):  # engines 0, 1; trainer
        run = tmp_path / placement
        release = ["rollout.release_memory=true"] if placement == "colocated" else []  # the KV cache freed per update
        _driver(_recipe(tmp_path, run), "train.steps=2", "checkpoint.every=0", f"ray.placement={placement}",
                "rollout.num_engines=2", "ray.num_cpus=3", *release)
        for name, rows in want.items():
            assert _lines(run, name) == rows, (placement, name)
        placed = json.loads((run / "workers.json").read_text())["placement"]
        workers = placed["rollout"] + placed["trainer"]
        assert [w["bundle"] for w in workers] == bundles, placed
        assert all(w["placement_group"] == w["of"] for w in workers), placed  # each actor runs in the group
        assert [b["CPU"] for b in placed["bundles"]] == ([3.0] if placement == "colocated" else [1.0] * 3), placed


def test_a_dead_engine_replica_stops_the_run_clearly_and_it_resumes_to_the_same_bits(tmp_path, inline6):
    """Two engine replicas as Ray actors; one is killed (SIGKILL to the pid the run recorded in
    workers.json) after the first checkpoint: the run stops with one line naming the engine, the step
    and the checkpoint to resume from (exit 3), and resumed it gives the uninterrupted run's later steps
    exactly."""
    whole, broken = inline6, tmp_path / "broken"  # (checkpoints every 3 there, every step here: no bit differs)
    proc = _driver(_recipe(tmp_path, broken), "rollout.num_engines=2", "ray.num_cpus=3", "checkpoint.every=1",
                   wait=False)
    deadline = time.time() + 600
    while not (broken / "checkpoints" / "step_000001").is_dir():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.1)
    engines = json.loads((broken / "workers.json").read_text())["rollout"]
    assert len(engines) == 2 and os.getpid() not in engines
    os.kill(engines[1], signal.SIGKILL)  # a process of the run this test started
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 3, out[-2000:] + err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: step ") and "RolloutWorker worker 1 of 2 died" in line, line
    assert f"resume from {broken / 'checkpoints'}" in line and line.endswith("with --resume"), line
    _driver(_recipe(tmp_path, broken), "--resume", "ray.mode=inline", "rollout.num_engines=2")
    for name in ("bitcheck.jsonl", "metrics.jsonl", "samples.jsonl"):
        a, b = _lines(whole, name), _lines(broken, name)
        assert sorted(b) == [1, 2, 3, 4, 5, 6]
        assert all(a[step] == b[step] for step in range(1, 7)), name


def test_a_killed_run_resumes_to_the_uninterrupted_runs_bits(tmp_path, inline6):
    whole, killed = inline6, tmp_path / "killed"
    rows = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    saved = {r["step"]: r["checkpoint_time_s"] for r in rows if "checkpoint_time_s" in r}  # every 3 steps, of 6
    assert len(rows) == 6 and sorted(saved) == [3, 6] and all(t > 0 for t in saved.values()), saved
    proc = _driver(_recipe(tmp_path, killed), "ray.mode=inline", wait=False)
    deadline = time.time() + 600
    while not (killed / "checkpoints" / "step_000003").is_dir():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its step-3 checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run, somewhere in step 4
    proc.wait()
    _driver(_recipe(tmp_path, killed), "--resume", "ray.mode=inline")
    for name in ("bitcheck.jsonl", "metrics.jsonl", "samples.jsonl"):
        a, b = _lines(whole, name), _lines(killed, name)
        assert sorted(b) == [1, 2, 3, 4, 5, 6]
        for step in (4, 5, 6):
            assert a[step] == b[step], f"{name} step {step} differs after resume"
    assert _lines(whole, "metrics.jsonl")[6]["weights_digest"] == _lines(killed, "metrics.jsonl")[6]["weights_digest"]
    # --resume PATH: from the step-3 checkpoint of the whole run, into a new directory
    again = tmp_path / "again"
    _driver(_recipe(tmp_path, again), "ray.mode=inline", "--resume", str(whole / "checkpoints" / "step_000003"))
    assert _lines(again, "metrics.jsonl")[6]["weights_digest"] == _lines(whole, "metrics.jsonl")[6]["weights_digest"]


@pytest.mark.parametrize("override, message", [
    ("train.stepz=3", "train.stepz"),
    ("train.steps=many", "train.steps"),
    ("model.path=/nonexistent/model", "/nonexistent/model"),
    ("data.source=/nonexistent/data.jsonl", "/nonexistent/data.jsonl"),
    ("rollout.num_engines=0", "rollout.num_engines: must be >= 1"),
    ("ray.weight_sync=nccl", "ray.weight_sync"),
    # 3 engines and the trainer are 4 Ray actors of one CPU each: refused, where Ray would wait forever
    ("rollout.num_engines=3", "rollout.num_engines: 3 engine(s) and the trainer need 4 CPU(s) of Ray; the cluster "
                              "has 2 (raise ray.num_cpus)"),
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
                          f"run.dir={run_dir}", "train.steps=1", "checkpoint.every=0", "rollout.prompts_per_step=2",
                          "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8", "log.tensorboard=false"],
                         cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (check,) = _lines(run_dir, "bitcheck.jsonl").values()
    assert check["tokens_compared"] > 0 and check["bit_match"] == 1.0 and check["kl_k1"] == 0.0
    metrics = _lines(run_dir, "metrics.jsonl")[1]
    assert metrics["first_minibatch_ratio_ones"] == 1.0
    assert metrics["bitcheck_source"] == "update"  # one update per batch: no rescore pass
    assert (run_dir / "report.html").is_file()


def test_resume_problems_are_one_line_and_found_before_any_worker_starts(tmp_path):
    recipe = _recipe(tmp_path, tmp_path / "run")
    proc = _driver(recipe, "--resume", rc=2)  # no checkpoint at all (and Ray mode: it never starts)
    (line,) = proc.err.strip().splitlines()
    assert "no checkpoint" in line.lower() and str(tmp_path / "run") in line, line
    assert not (tmp_path / "run" / "recipe.yaml").exists(), "the run started before the resume check"
    _driver(recipe, "ray.mode=inline", "train.steps=3", "checkpoint.every=1", "checkpoint.keep=3")
    newest = tmp_path / "run" / "checkpoints" / "step_000003"
    (newest / "manifest.json").write_text("{")
    (tmp_path / "run" / "recipe.yaml").unlink()
    proc = _driver(recipe, "--resume", "train.steps=4", rc=2)
    (line,) = proc.err.strip().splitlines()
    assert "step_000003: unreadable manifest.json" in line and "not loaded" in line, line
    assert str(tmp_path / "run" / "checkpoints" / "step_000002") in line, "the newest intact checkpoint is named"
    assert not (tmp_path / "run" / "recipe.yaml").exists()
