"""The HTML report from synthetic logs: a passing run (all tokens bit-equal) and a stock-like run (the
negative control: bit-match below 100 %, KL != 0, ratio != 1); plots say "not recorded" for missing
keys; the CLI's errors for a missing directory and empty logs."""
from __future__ import annotations

import runpy
import sys

import pytest
import torch

from detent_rl import bitcheck as B, runlog as L
from detent_rl import report as R


def _fake_run(run_dir, *, mismatching: bool, steps: int = 4, keys: tuple[str, ...] | None = None,
              recipe: str | None = "arm: detent\n") -> None:
    g = torch.Generator().manual_seed(0)
    with L.RunLog(run_dir, tensorboard=False, progress=False, total_steps=steps) as log:
        for s in range(1, steps + 1):
            ids = [f"s{s}-q{i}" for i in range(3)]
            rollout = [-torch.rand(8, generator=g) * 4 for _ in ids]
            rescored = [t.clone() for t in rollout]
            if mismatching:
                for t in rescored:
                    t[2::3] += 1e-3 * torch.randn(t[2::3].shape, generator=g)
            record = B.bitcheck(s, ids, rollout, rescored)
            log.bitcheck(record)
            ratio = 1.0 + (0.01 * s if mismatching else 0.0)
            metrics = {"reward_mean": 0.1 * s, "bit_match": record["bit_match"], "kl_k1": record["kl_k1"],
                       "kl_k3": record["kl_k3"], "step_time_s": 1.5, "tokens_per_s": 100.0,
                       "rollout_ratio_mean": ratio, "rollout_ratio_min": 2 - ratio, "rollout_ratio_max": ratio,
                       "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0, "loss": 0.3}
            log.metrics(s, {k: v for k, v in metrics.items() if keys is None or k in keys})
    if recipe is not None:
        (run_dir / "recipe.yaml").write_text(recipe)


def test_passing_run_report(tmp_path):
    _fake_run(tmp_path, mismatching=False)
    path = R.write_report(tmp_path)
    assert path == tmp_path / "report.html"
    page = path.read_text()
    assert page.count('<img src="data:image/png;base64,') >= 4
    assert "all 96 tokens bit-equal in all steps" in page
    assert "<td>detent</td>" in page and "<td>100 %" in page
    assert "not recorded (clip_frac)" in page  # a key the run did not log
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched when opened


def test_stock_like_run_report_shows_the_mismatch(tmp_path):
    _fake_run(tmp_path, mismatching=True, recipe="run:\n  name: x\nselection:\n  arm: stock\n")
    page = R.write_report(tmp_path).read_text()
    records = L.read_jsonl(tmp_path / L.BITCHECK_FILE)
    first = records[0]["first_mismatches"][0]
    assert first["request_id"] == "s1-q0" and first["position"] == 2
    row = f"<tr><td>1</td><td>s1-q0</td><td>2</td><td>{first['rollout']}</td><td>{first['rescored']}</td>"
    assert row in page
    assert "tokens differ (bit-match" in page and "bit-equal in all steps" not in page
    assert "<td>stock</td>" in page
    assert "pi_trainer / pi_rollout range" in page and "0.96 to 1.04" in page


def test_the_report_shows_the_resolved_commitment_tuple_and_its_hash(tmp_path):
    from detent_rl.kernels.commitment import CommitmentTuple
    _fake_run(tmp_path, mismatching=False)
    assert "not recorded (no commitment.json" in R.write_report(tmp_path).read_text()
    tuple_ = CommitmentTuple({"matmul[k=8][n=16]": {"pins": {"chunk": 128}, "knobs": {"schedule_by_m": True}}},
                             deployment={"hidden": 8})
    tuple_.save(tmp_path / R.COMMITMENT_FILE)
    page = R.write_report(tmp_path).read_text()
    assert f"sha256 {tuple_.sha256()}, 1 call sites" in page and "matmul[k=8][n=16]" in page
    (tmp_path / R.COMMITMENT_FILE).write_text("{")
    with pytest.raises(R.ReportError, match="commitment.json"):
        R.write_report(tmp_path)


def test_missing_keys_say_not_recorded(tmp_path):
    _fake_run(tmp_path, mismatching=False, keys=("reward_mean",), recipe=None)
    page = R.write_report(tmp_path).read_text()
    assert "not recorded (step_time_s)" in page
    assert "bit-equal in all steps" in page  # bit-match and KL fall back to bitcheck.jsonl
    assert "not recorded (no recipe.yaml)" in page


def test_cli_writes_to_out_and_errors_name_the_path(tmp_path, capsys):
    _fake_run(tmp_path / "run", mismatching=False, steps=1)
    out = tmp_path / "elsewhere" / "r.html"
    assert R.main([str(tmp_path / "run"), "--out", str(out)]) == 0
    assert out.exists() and str(out) in capsys.readouterr().out
    assert R.main([str(tmp_path / "nope")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "nope") in err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / L.METRICS_FILE).write_text("")
    assert R.main([str(tmp_path / "empty")]) != 0
    assert "no logs in" in capsys.readouterr().err


def test_module_entry_point(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m detent_rl.report", str(tmp_path / "missing")])
    monkeypatch.delitem(sys.modules, "detent_rl.report")  # as `python -m` finds it: not yet imported
    with pytest.raises(SystemExit) as info:  # in process: a subprocess would spend seconds importing torch
        runpy.run_module("detent_rl.report", run_name="__main__")
    assert info.value.code != 0 and "run directory not found" in capsys.readouterr().err


def test_bad_lines_are_one_line_errors(tmp_path, capsys):
    _fake_run(tmp_path, mismatching=False, steps=2)
    with open(tmp_path / L.METRICS_FILE, "a") as f:
        f.write('{"step":3,"reward_mean":"high"}\n')
    assert R.main([str(tmp_path)]) != 0
    assert "metrics.jsonl: 'reward_mean' at step 3 is not a number" in capsys.readouterr().err
    with open(tmp_path / L.BITCHECK_FILE, "a") as f:
        f.write("not json\n")
    assert R.main([str(tmp_path)]) != 0
    assert f"{tmp_path / L.BITCHECK_FILE}:3: not a JSON line" in capsys.readouterr().err
