"""`python -m detent_rl.bench` end to end on the CPU (`--quick`, the tiny model): every arm runs every
case on the same weights, ratios are to stock's run, the online (Poisson) serving finishes every
request, and the tables, JSON and plot are written; bad arguments name what is wrong. The figures
themselves are the H200's (docs/BENCHMARKS.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from detent_rl.bench import ARMS, CASES, main
from detent_rl.bench_cases import poisson_arrivals


def test_quick_bench_runs_every_arm_and_case(tmp_path, capsys):
    cases = [c for c in CASES if c != "gemm"]  # gemm: CUDA only
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", ",".join(cases),
                 "--stock-pdl", "on,off", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["cases"]) == cases and all(set(data["cases"][c]) == set(ARMS) for c in cases)
    assert data["copy_bandwidth_gbs"] > 0 and data["weight_bytes"] > 0 and data["poisson_rate_per_s"] > 0
    assert data["step_graphs"] is False  # --step-graphs auto: whole-step graphs on a CUDA device only
    # stock ran with our kernels' PDL on and off and kept its faster run per case
    assert all([r["pdl"] for r in data["stock_runs"][c]] == ["on", "off"] for c in cases)
    assert all(data["cases"][c]["stock"] in data["stock_runs"][c] for c in cases)
    for arm in ARMS:
        assert data["cases"]["decode-1"][arm]["ms_per_step"] > 0
        p = data["cases"]["poisson"][arm]
        assert 0 < p["p50_ms"] <= p["p90_ms"] <= p["p99_ms"]
        assert p["steps"] > 0 and 0 < p["step_median_ms"] <= p["step_max_ms"]  # a stall in the timed run shows
        assert p["gc_full"] >= 0 and 0 <= p["gc_step_max_ms"] <= min(p["gc_ms"], p["step_max_ms"])  # its GC pauses
        assert p["compiles"] == 0 and p["warmup_s"] > 0  # (the CPU compiles nothing; the GPU's count is the check)
        assert p["warmup_mib"] == 0  # the device memory the warm-up kept: none on the CPU (the GPU reports its pools)
        assert 0 < p["eager_steps"] <= p["steps"] and p["eager_ms"] > 0 and p["graph_ms"] >= 0
        # the eager steps' sizes: every prompt is prefilled in them, so the largest holds at least one whole chunk
        assert p["eager_tokens_median"] >= 1
        assert p["eager_tokens_median"] <= p["eager_tokens_max"] <= data["limits"]["poisson"]["max_num_tokens"]
        assert 0 <= p["step_max_tokens"] <= p["eager_tokens_max"]  # the slowest step's: 0 for a decode replay
        assert data["cases"]["grpo"][arm]["tok_per_s"] > 0
    # on the CPU the stock arm has no decode graphs (every step eager); CoRun's padded decode step runs as one
    assert data["cases"]["poisson"]["stock"]["eager_steps"] == data["cases"]["poisson"]["stock"]["steps"]
    assert data["cases"]["poisson"]["corun"]["eager_steps"] < data["cases"]["poisson"]["corun"]["steps"]
    assert data["cases"]["poisson"]["stock"]["step_max_tokens"] >= 1  # every stock step is eager here
    table = (tmp_path / "bench.md").read_text()
    assert f"(an eager step of {data['cases']['poisson']['stock']['step_max_tokens']:,} tokens), 0 graphs captured" \
        in table
    assert table.count("| 1.00x |") >= len(cases)  # stock against itself
    assert f"eager, median {data['cases']['poisson']['stock']['eager_tokens_median']:,.0f} tokens" in table
    # CoRun pads its decode to its deployment's maximum concurrency: each case's own engine's, not the GRPO batch's
    # 256 shared by the other arms (which padded a batch-1 decode to 256 rows)
    shared = data["limits"]["decode-1"]["max_batch"]
    assert {c: data["cases"][c]["corun"]["max_batch"] for c in cases} == \
        {"decode-1": 1, "decode-32": 32, "poisson": min(64, shared), "grpo": 4, "long": 2}
    assert all(data["cases"][c][a]["max_batch"] == shared for c in cases for a in ARMS if a != "corun")
    assert "corun's max_batch, the rows of its padded decode: decode-1 1; decode-32 32;" in table
    assert "% of roofline" in table and (tmp_path / "bench.png").stat().st_size > 0
    assert "wrote" in capsys.readouterr().out


def test_step_graphs_run_in_every_arm(tmp_path, capsys):
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "poisson,grpo",
                 "--arms", "stock,detent", "--step-graphs", "on", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["step_graphs"] is True
    # --stock-pdl auto: off the GPU there is no PDL to set, so stock runs once
    assert all([r["pdl"] for r in data["stock_runs"][c]] == ["on"] for c in ("poisson", "grpo"))
    assert all(data["cases"][c][arm]["piece_steps"] > 0 for c in ("poisson", "grpo") for arm in ("stock", "detent"))
    assert "piecewise graphs, every arm" in (tmp_path / "bench.md").read_text()


def test_step_graphs_off_and_on_in_one_run_pair_each_arm_with_its_own_kind_of_stock(tmp_path, capsys):
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "poisson,grpo",
                 "--arms", "stock,detent", "--stock-pdl", "on", "--step-graphs", "off,on", "--rounds", "2",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    arms = ["stock", "stock + pieces", "detent", "detent + pieces"]
    assert data["step_graphs"] == "both" and data["arms"] == arms
    assert all(set(r[c]) == set(arms) for r in data["rounds"] for c in ("poisson", "grpo"))
    for r in data["rounds"]:  # only the graphed runs went through the pieces
        assert all(("piece_steps" in r[c][a]) == a.endswith("pieces") for c in ("poisson", "grpo") for a in arms)
        assert all(r[c][a]["piece_steps"] > 0 for c in ("poisson", "grpo") for a in arms if a.endswith("pieces"))
    grpo = [{a: r["grpo"][a]["tok_per_s"] for a in arms} for r in data["rounds"]]
    ratios = data["round_ratios"]["grpo"]
    assert ratios["stock + pieces"] == [1.0, 1.0]  # over its own kind of stock run, not the plain one
    assert ratios["detent + pieces"] == pytest.approx([g["stock + pieces"] / g["detent + pieces"] for g in grpo])
    assert ratios["detent"] == pytest.approx([g["stock"] / g["detent"] for g in grpo])
    table = (tmp_path / "bench.md").read_text()
    assert "each arm also through piecewise step graphs" in table and "| stock + pieces (PDL on) |" in table
    effect = sorted(g["detent"] / g["detent + pieces"] for g in grpo)
    assert "Time through the pieces over without" in table and f"| grpo | detent | {sum(effect) / 2:.2f}x (" in table
    with pytest.raises(SystemExit):
        main(["--step-graphs", "on,off", "--out", str(tmp_path)])
    assert "--step-graphs: invalid choice: 'on,off'" in capsys.readouterr().err


def test_kernels_gives_each_arms_poisson_time_by_kernel(tmp_path):
    """`--kernels`: one more Poisson serve per arm under the profiler, its time by kernel (on the CPU by operator:
    the engine's steps, the model's ops), costliest first, and a table of the costliest over the arms."""
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "poisson,grpo",
                 "--arms", "stock,detent", "--stock-pdl", "on", "--kernels", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    for arm in ("stock", "detent"):
        kernels = data["cases"]["poisson"][arm]["kernels"]
        assert kernels and all(n > 0 and ms >= 0 for _, n, ms in kernels)
        assert [ms for _, _, ms in kernels] == sorted((ms for _, _, ms in kernels), reverse=True)
        assert "kernels" not in data["cases"]["grpo"][arm]  # the Poisson case only
    table = (tmp_path / "bench.md").read_text()
    assert "Poisson, one more serve under the profiler: ms by kernel" in table
    assert "| kernel | stock | detent |" in table
    name, n, ms = data["cases"]["poisson"]["stock"]["kernels"][0]
    assert f"| {name} | {ms:.1f} ({n:,}; {1e3 * ms / n:.1f} µs) |" in table  # and the time a launch
    total = sum(ms for _, _, ms in data["cases"]["poisson"]["detent"]["kernels"])
    assert f" {total:.1f} (" in table.split("| all |")[1].splitlines()[0]


def test_the_gated_mlp_off_and_on_in_one_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DETENT_GATED_MLP", "x")  # the runs set it; it is put back after
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "decode-1,grpo",
                 "--arms", "stock,detent", "--stock-pdl", "on", "--gated-mlp", "off,on", "--step-graphs", "off,on",
                 "--out", str(tmp_path)]) == 0
    import os
    assert os.environ["DETENT_GATED_MLP"] == "x"
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["gated_mlp"] == "both" and data["step_graphs"] == "both"
    assert data["arms"] == ["stock", "stock + pieces", "detent", "detent + gated", "detent + pieces",
                            "detent + pieces + gated"]  # stock's gated twin would be its plain run: not made
    grpo = {a: r["tok_per_s"] for a, r in data["cases"]["grpo"].items()}
    table = (tmp_path / "bench.md").read_text()
    for arm, stock in (("detent + gated", "stock"), ("detent + pieces + gated", "stock + pieces")):
        assert f"| grpo | {arm} |" in table and f"{grpo[stock] / grpo[arm]:.2f}x |" in table
    assert "Time with the gated MLP epilogue over without" in table and "Time through the pieces over" in table
    assert f"| grpo | detent + pieces | {grpo['detent + pieces'] / grpo['detent + pieces + gated']:.2f}x |" in table


def test_rounds_pair_each_ratio_with_its_own_stock_run(tmp_path, capsys):
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases",
                 "decode-1,grpo,poisson", "--arms", "stock,detent", "--stock-pdl", "on", "--rounds", "3",
                 "--out", str(tmp_path)]) == 0
    # each round starts at the next arm (whatever a process's first run of a kernel meets is not always stock's)
    order = [line.split(",")[0] for line in capsys.readouterr().out.splitlines() if line.endswith(": decode-1")]
    assert order == ["stock", "detent", "detent", "stock", "stock", "detent"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["poisson_rate_per_s"] > 0 and all("poisson" in r for r in data["rounds"])
    assert len(data["rounds"]) == 3 and len(data["stock_runs"]["grpo"]) == 3
    import os  # without --isolate every run is this process's (test_bench_isolate.py: each run its own)
    assert {r[c][a]["pid"] for r in data["rounds"] for c in ("decode-1", "grpo") for a in ("stock", "detent")} == \
        {os.getpid()}
    assert not data["isolated"] and "process of its own" not in (tmp_path / "bench.md").read_text()
    for case, metric in (("decode-1", "ms_per_step"), ("grpo", "tok_per_s")):
        stock = [r[case]["stock"][metric] for r in data["rounds"]]
        ours = [r[case]["detent"][metric] for r in data["rounds"]]
        paired = [s / o if case == "grpo" else o / s for s, o in zip(stock, ours)]
        assert data["round_ratios"][case]["detent"] == pytest.approx(paired)
        assert data["round_ratios"][case]["stock"] == [1.0, 1.0, 1.0]
        # the arm's shown result is its median round's
        assert data["cases"][case]["detent"][metric] == sorted(ours)[1]
    grpo = data["cases"]["grpo"]["detent"]
    assert grpo["prefill_s"] > 0 and grpo["decode_ms_per_step"] > 0 and grpo["prefill_s"] < grpo["wall_s"]
    table = (tmp_path / "bench.md").read_text()
    assert "median of 3 rounds" in table and "ms/step)" in table and "rounds done" not in table
    median = sorted(data["round_ratios"]["grpo"]["detent"])[1]
    assert f"| {median:.2f}x (" in table
    # each arm's own figure in every round, beside the paired ratios: which side of a ratio moved
    for case, metric, fmt in (("decode-1", "ms_per_step", "{:.3f}"), ("grpo", "tok_per_s", "{:,.0f}"),
                              ("poisson", "p50_ms", "{:.3f}")):
        for arm in ("stock", "detent"):
            each = ", ".join(fmt.format(r[case][arm][metric]) for r in data["rounds"])
            assert f"; rounds {each} |" in table, (case, arm)


def test_arrivals_are_a_seeded_poisson_process_and_bad_arguments_are_refused(tmp_path, capsys):
    a = poisson_arrivals(2000, rate=4.0)
    assert a == sorted(a) and a == poisson_arrivals(2000, rate=4.0)
    assert abs(a[-1] / len(a) - 0.25) < 0.02  # mean gap 1 / rate
    with pytest.raises(SystemExit):
        main(["--cases", "decode-1,warp", "--out", str(tmp_path)])
    assert "--cases: unknown ['warp']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--arms", "stock,tuned", "--out", str(tmp_path)])
    assert "--arms tuned: give its tuple with --commitment" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--load", "3", "--out", str(tmp_path)])
    assert "--load 3.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--out", str(tmp_path)])
    assert "--rounds 0: give 1 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--stock-pdl", "sometimes", "--out", str(tmp_path)])
    assert "--stock-pdl 'sometimes': give on, off, on,off or auto" in capsys.readouterr().err
    missing = tmp_path / "none"
    for argv, message in ((["--model", str(missing)], f"--model: '{missing}' is neither a built-in model (smollm2"),
                          (["--model", str(tmp_path)], f"--model: {tmp_path}/config.json: no such config file"),
                          (["--device", "mps"], "--device mps: the tools run on cpu or cuda")):
        with pytest.raises(SystemExit):  # before any model is loaded or written
            main([*argv, "--out", str(tmp_path)])
        assert message in capsys.readouterr().err


def test_each_case_takes_its_own_tuple_and_a_bad_one_is_refused_before_any_arm_runs(tmp_path, capsys):
    """`--commitment CASE=FILE,...`: the tuned arm runs each named case with its tuple (one model a file) and no
    other case; a case not in the run, or a tuple of another deployment, is refused before anything runs."""
    import torch

    from detent_rl.bench_cases import QUICK
    from detent_rl.models import load_model
    from detent_rl.models.builtin import builtin_checkpoint

    longest = max(QUICK.decode_prompt + QUICK.decode_new, QUICK.poisson_prompt[1] + QUICK.poisson_new[1],
                  QUICK.grpo[2] + QUICK.grpo[3])
    limits = dict(max_context=longest + 16, max_batch=64, max_num_tokens=8192)  # the quick run's, as main sizes them

    def tuple_file(name: str, **change) -> str:
        model = load_model(builtin_checkpoint("tiny"), "detent", device="cpu", dtype=torch.float32,
                           **{**limits, **change})
        return str(model.selections.resolved().save(tmp_path / name))
    a, b = tuple_file("a.json"), tuple_file("b.json")
    base = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--arms", "stock,tuned",
            "--stock-pdl", "on", "--cases", "decode-1,decode-32,grpo"]
    assert main(base + ["--commitment", f"decode-1={a},grpo={b}", "--out", str(tmp_path / "run")]) == 0
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert data["cases"]["decode-1"]["tuned"]["commitment"] == a and data["cases"]["grpo"]["tuned"]["commitment"] == b
    assert "tuned" not in data["cases"]["decode-32"] and "stock" in data["cases"]["decode-32"]
    assert {c: t["file"] for c, t in data["commitment"].items()} == {"decode-1": a, "grpo": b}
    assert f"decode-1 with {a}" in (tmp_path / "run" / "bench.md").read_text()
    assert main(base + ["--commitment", a, "--out", str(tmp_path / "one")]) == 0  # one FILE: every case
    one = json.loads((tmp_path / "one" / "bench.json").read_text())
    assert all(one["cases"][c]["tuned"]["commitment"] == a for c in ("decode-1", "decode-32", "grpo"))
    assert "tuned:" not in (tmp_path / "one" / "bench.md").read_text()  # one tuple: no per-case line
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(base + ["--commitment", f"long={a}", "--out", str(tmp_path / "x")])
    assert "case 'long' is not among this run's --cases" in capsys.readouterr().err
    other = tuple_file("other.json", max_num_tokens=4096)
    with pytest.raises(SystemExit):
        main(base + ["--commitment", f"grpo={other}", "--out", str(tmp_path / "y")])
    err = capsys.readouterr().err
    assert f"--commitment {other}:" in err and "max_num_tokens" in err
    assert not (tmp_path / "y").exists()  # refused before any arm ran


def test_the_long_case_runs_under_its_own_deployment_beside_the_short_cases_tuples(tmp_path, capsys):
    """One run holds every case: the long case's deployment (its context, `--max-num-tokens ...,long=N`) is its
    own in every arm, so a tuple made for it and one made for the serving cases are both taken; a tuple of
    the short cases' deployment given to the long case is refused before anything runs, and so is a
    malformed `--max-num-tokens`."""
    import torch

    from detent_rl.bench import case_limits
    from detent_rl.bench_cases import QUICK
    from detent_rl.models import load_model
    from detent_rl.models.builtin import builtin_checkpoint

    limits = case_limits(["decode-1", "long"], QUICK, {"": 8192, "long": 4096})
    assert limits["long"]["max_context"] > limits["decode-1"]["max_context"]
    assert (limits["decode-1"]["max_num_tokens"], limits["long"]["max_num_tokens"]) == (8192, 4096)

    def tuple_file(name: str, case: str) -> str:
        model = load_model(builtin_checkpoint("tiny"), "detent", device="cpu", dtype=torch.float32, **limits[case])
        return str(model.selections.resolved().save(tmp_path / name))
    short, long = tuple_file("short.json", "decode-1"), tuple_file("long.json", "long")
    base = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--arms", "stock,detent,tuned",
            "--stock-pdl", "on", "--cases", "decode-1,long"]
    assert main(base + ["--max-num-tokens", "8192,long=4096", "--commitment", f"decode-1={short},long={long}",
                        "--out", str(tmp_path / "run")]) == 0
    data = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert data["limits"] == limits
    for case, f in (("decode-1", short), ("long", long)):
        assert set(data["cases"][case]) == {"stock", "detent", "tuned"}
        assert data["cases"][case]["tuned"]["commitment"] == f and data["cases"][case]["tuned"]["ms_per_step"] > 0
    assert "long max_batch 64, max_context" in (tmp_path / "run" / "bench.md").read_text()
    capsys.readouterr()
    for tokens, commitment, said in (("8192", f"long={short}", "the long case's limits"),
                                     ("long=4096", short, "give the default N first"),
                                     ("8192,grpo=4096", short, "case 'grpo' is not among this run's --cases"),
                                     ("8192,long=x", short, "'x' in 'long=x' is not a whole number"),
                                     ("8192,8192", short, "the default given twice")):
        with pytest.raises(SystemExit):
            main(base + ["--max-num-tokens", tokens, "--commitment", commitment, "--out", str(tmp_path / "x")])
        assert said in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_run_cut_short_keeps_the_rounds_it_finished(tmp_path, monkeypatch):
    """The files are written after every round: a run stopped in its second round keeps the first's tables."""
    import detent_rl.bench as bench

    calls, real = [], bench.run

    def stopped_in_round_two(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("stopped")
        return real(*a, **kw)
    monkeypatch.setattr(bench, "run", stopped_in_round_two)
    with pytest.raises(KeyboardInterrupt):
        main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "decode-1",
              "--arms", "stock,detent", "--stock-pdl", "on", "--rounds", "2", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["rounds_asked"] == 2 and data["cases"]["decode-1"]["detent"]["ms_per_step"] > 0
    assert "1 of 2 rounds done" in (tmp_path / "bench.md").read_text()


def test_the_gemm_table_gives_our_kernel_alone_and_under_pdl():
    from detent_rl.bench_report import render

    rows = [{"site": "896->1152", "m": 512, "cublas_us": 5.0, "ratio": 1.12, "ratio_pdl": 1.30, "chunk": 896}]
    results = {"device": "H200", "copy_bandwidth_gbs": 4000.0, "weight_bytes": 10 ** 9,
               "cases": {"gemm": {"stock": {}, "detent": {"sites": rows}}}}
    text = render(results)
    assert "alone (PDL off) / with PDL on" in text and "| 896->1152 | 512 | 5.0 | 1.12x / 1.30x (chunk 896) |" in text


def test_a_given_poisson_rate_is_the_traces_in_every_round(tmp_path, capsys):
    """`--poisson-rate`: the trace arrives at that rate (not --load x stock's offline rate), and the table says it;
    a rate that is not a positive number is refused naming the flag."""
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "poisson",
                 "--arms", "stock,detent", "--stock-pdl", "on", "--poisson-rate", "40", "--rounds", "2",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["poisson_rate_per_s"] == 40.0 and len(data["rounds"]) == 2
    assert "Poisson arrivals 40.0 requests/s" in (tmp_path / "bench.md").read_text()
    for bad in ("0", "-3", "nan"):
        with pytest.raises(SystemExit):
            main(["--poisson-rate", bad, "--out", str(tmp_path)])
        assert f"--poisson-rate: expected a positive number of requests/s, got {float(bad)}" in capsys.readouterr().err


def test_the_poisson_result_is_the_median_serve_of_several(tmp_path, capsys):
    """`--serves N`: each arm serves the trace N times after its one warm-up; its result is the serve with the median
    p50 (every serve's p50 kept, in order), and the table gives their range. 0 serves is refused."""
    assert main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "poisson",
                 "--arms", "stock,detent", "--stock-pdl", "on", "--serves", "3", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    table = (tmp_path / "bench.md").read_text()
    for arm in ("stock", "detent"):
        r = data["cases"]["poisson"][arm]
        each = r["serves_p50_ms"]
        assert len(each) == 3 and r["p50_ms"] == sorted(each)[1]
        assert f"(median p50 of 3 serves: {min(each):.2f}-{max(each):.2f})" in table
    with pytest.raises(SystemExit):
        main(["--serves", "0", "--out", str(tmp_path)])
    assert "--serves 0: give 1 or more" in capsys.readouterr().err


def test_kernel_times_count_a_pdl_wait_once():
    """Under PDL a dependent kernel's span opens while its predecessor runs. Each kernel's exclusive time is its span
    after the earlier spans closed: the times add up to the spans' union. Control: the spans summed as they are count
    the overlap twice, the dependent's wait as its own time."""
    from detent_rl.kernel_times import exclusive_times
    spans = [(0.0, 10.0, "gemm"), (2.0, 12.0, "silu"),  # resident at 2, waits for the GEMM, runs 10-12
             (12.5, 20.0, "gemm"), (13.0, 14.0, "norm"),  # a span inside an earlier, longer one: no time of its own
             (25.0, 26.0, "norm")]  # after a gap
    times = exclusive_times(spans)
    assert times == {"gemm": (2, 17.5), "silu": (1, 2.0), "norm": (2, 1.0)}
    assert list(times) == ["gemm", "silu", "norm"]  # costliest first
    union = 12.0 + 7.5 + 1.0
    assert sum(us for _, us in times.values()) == union
    assert sum(e - s for s, e, _ in spans) - union == 8.0 + 1.0  # the control: the plain sums' double count


def test_combine_bench_names_a_bad_schedule_and_swaps_the_engines_combine():
    """`bench/combine_bench.py`: a schedule not of the form uUwW, or bench arguments without --engine, are refused
    with the value named; --engine sets the engine's combine before the bench (or --script) parses its arguments."""
    script = str(Path(__file__).parent.parent / "bench" / "combine_bench.py")
    run = lambda *a: subprocess.run([sys.executable, "-P", script, *a], capture_output=True, text=True)  # noqa: E731
    assert "'u4x1': expected uUwW or hUwW" in run("--schedules", "u4x1").stderr
    assert "(--x) are the bench's: they need --engine" in run("--", "--x").stderr
    swapped = run("--engine", "u2w1", "--", "--help")
    assert swapped.returncode == 0 and "combine: u2w1 (_combine_kernel, 2 splits a trip, 1 warps)" in swapped.stdout
    rows = run("--engine", "h2w4", "--", "--help")
    assert rows.returncode == 0 and "combine: h2w4 (_combine_heads_kernel, 2 splits a trip, 4 warps)" in rows.stdout
    both = run("--engine", "u4w1", "--heads-from", "512", "--", "--help").stdout
    assert "(_combine_kernel, 4 splits a trip, 1 warps; from 512 rows _combine_heads_kernel, 1 splits" in both
    plain = run("--engine", "plain", "--", "--help")
    assert plain.returncode == 0 and "combine: plain (ordered_combine, one split a trip, 4 warps)" in plain.stdout
    profile = run("--engine", "u8w1", "--script", str(Path(script).parent / "decode_profile.py"), "--", "--help")
    assert profile.returncode == 0 and "usage: decode_profile.py" in profile.stdout and "u8w1" in profile.stdout
    assert "--script nope.py: no such file" in run("--engine", "plain", "--script", "nope.py").stderr
