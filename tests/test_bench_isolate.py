"""`python -m detent_rl.bench --isolate`: every run of a round in a process of its own, merged as one round."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from detent_rl.bench import main
from detent_rl.bench_isolate import child_command, merge_run


def test_isolated_rounds_run_each_arm_in_its_own_process_and_pair_the_ratios(tmp_path):
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "decode-1,poisson",
                 "--arms", "stock,detent", "--stock-pdl", "on", "--rounds", "2", "--isolate",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert len(data["rounds"]) == 2
    pids = [r[case][arm]["pid"] for r in data["rounds"] for case in ("decode-1", "poisson")
            for arm in ("stock", "detent")]
    # per round and arm one process, none of them this one (control: both cases of an arm share its process)
    assert os.getpid() not in pids and len(set(pids)) == 4
    assert all(r["decode-1"][arm]["pid"] == r["poisson"][arm]["pid"] for r in data["rounds"]
               for arm in ("stock", "detent"))
    # the rounds alternate the first run as in one process: round 2 starts at detent, whose child saw no stock run
    child = json.loads((tmp_path / "isolated" / "round2_run1" / "bench.json").read_text())
    assert set(child["cases"]["decode-1"]) == {"detent"}
    # every run serves the arrivals of the first stock run's rate
    first = json.loads((tmp_path / "isolated" / "round1_run1" / "bench.json").read_text())
    assert set(first["cases"]["decode-1"]) == {"stock"}
    assert data["poisson_rate_per_s"] == first["poisson_rate_per_s"] == child["poisson_rate_per_s"]
    for case, metric in (("decode-1", "ms_per_step"), ("poisson", "p50_ms")):
        paired = [r[case]["detent"][metric] / r[case]["stock"][metric] for r in data["rounds"]]
        assert data["round_ratios"][case]["detent"] == pytest.approx(paired)
    assert "median of 2 rounds" in (tmp_path / "bench.md").read_text()
    assert "each arm's run in a process of its own" in (tmp_path / "bench.md").read_text() and data["isolated"]


def test_merge_keeps_the_faster_stock_run_and_names_each_child():
    into = {"cases": {"decode-1": {"stock": {"ms_per_step": 1.0, "pdl": "on"}}}, "stock_runs": {"decode-1": [1]}}
    slower = {"cases": {"decode-1": {"stock": {"ms_per_step": 1.2, "pdl": "off"}}}, "stock_runs": {"decode-1": [2]},
              "poisson_rate_per_s": 3.0}
    faster = {"cases": {"decode-1": {"stock": {"ms_per_step": 0.9, "pdl": "off"}, "detent": {"ms_per_step": 0.8}}},
              "stock_runs": {"decode-1": [3]}}
    merge_run(into, slower)
    assert into["cases"]["decode-1"]["stock"]["pdl"] == "on" and into["poisson_rate_per_s"] == 3.0
    merge_run(into, faster)
    assert into["cases"]["decode-1"]["stock"]["ms_per_step"] == 0.9 and "detent" in into["cases"]["decode-1"]
    assert into["stock_runs"]["decode-1"] == [1, 2, 3]
    cmd = child_command(["--arms", "stock,detent", "--rounds", "3", "--isolate"], 2, 1, ["decode-1"], 4.5,
                        Path("x"))
    # the parent's own options first, the run's settings after them: argparse keeps an option's last value
    assert cmd[cmd.index("detent_rl.bench") + 1:] == [
        "--arms", "stock,detent", "--rounds", "3", "--isolate", "--rounds", "1", "--first", "2", "--only", "1",
        "--cases", "decode-1", "--out", "x", "--poisson-rate", "4.5"]
    assert "--poisson-rate" not in child_command([], 0, 0, ["decode-1"], None, Path("x"))


def test_isolated_rounds_keep_the_first_rounds_gemm_case_and_its_tuple(tmp_path):
    """Past the first round a child leaves gemm out itself, as one process does, so `--commitment gemm=FILE` still
    names one of its cases (a child given the round's cases, gemm left out, refused that tuple)."""
    import torch

    from detent_rl.bench_cases import QUICK
    from detent_rl.models import load_model
    from detent_rl.models.builtin import builtin_checkpoint
    longest = max(QUICK.decode_prompt + QUICK.decode_new, QUICK.poisson_prompt[1] + QUICK.poisson_new[1],
                  QUICK.grpo[2] + QUICK.grpo[3])
    model = load_model(builtin_checkpoint("tiny"), "detent", device="cpu", dtype=torch.float32,
                       max_context=longest + 16, max_batch=64, max_num_tokens=8192)  # the quick run's limits
    tuple_file = str(model.selections.resolved().save(tmp_path / "t.json"))
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--arms", "stock,tuned",
                 "--stock-pdl", "on", "--cases", "decode-1,gemm", "--commitment",
                 f"decode-1={tuple_file},gemm={tuple_file}", "--rounds", "2", "--isolate",
                 "--out", str(tmp_path / "run")]) == 0
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert len(data["rounds"]) == 2 and all("tuned" in r["decode-1"] for r in data["rounds"])
    assert all("gemm" not in r for r in data["rounds"][1:])


def test_isolation_is_the_default_on_a_cuda_device_only():
    """A stock engine runs alone in its process, so on a CUDA device the bench isolates each run unless told `off`
    (stock's batch-1 step ~10 % slower after other runs in one process, session 59); on the CPU it keeps one process
    (`test_bench.py` checks every run's pid there), and a bare `--isolate` isolates anywhere (the test above)."""
    from detent_rl.bench import isolating
    assert isolating("auto", "cuda") and isolating("auto", "cuda:1") and isolating("on", "cpu")
    assert not isolating("auto", "cpu") and not isolating("off", "cuda")
