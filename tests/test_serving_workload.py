"""The tuner's online-serving workload (`ServingWorkload`, `python -m detent_rl.tune --serve`): the bench's Poisson
trace arriving in engine steps, so the tuner profiles the calls a serve makes, the same on every machine."""
from __future__ import annotations

import json

import pytest
import torch

from detent_rl.bench_cases import Shapes, trace_of
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.tune import main, profile
from detent_rl.workload import ServingWorkload
from test_models import LIMITS, hf_model, save

SMALL = dict(requests=8, prompt_range=(4, 40), new_range=(2, 8), max_num_seqs=8)


def _rows(calls) -> list[int]:
    """The token counts of the linears' calls (each distinct count once), the LM head's apart."""
    return sorted({args[0] for k, c in calls.items() if k.startswith("matmul") and "151936" not in k for args in c})


def test_a_serve_profiles_its_own_calls_the_same_on_every_run(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path / "m"), "detent", dtype=torch.float32, **LIMITS)
    serve = ServingWorkload(arrivals_per_step=0.5, **SMALL)
    due = serve.arrival_steps()
    assert len(due) == 8 and due == sorted(due) and due[-1] > 4  # spread over the steps, in order
    first, again = (profile(serve.engine(model), serve)[1] for _ in range(2))
    assert first == again  # arrivals counted in steps, not seconds: the same calls on any machine
    # control: every request arriving at once is the offline batch of the same trace, whose calls differ
    at_once = ServingWorkload(arrivals_per_step=1e9, **SMALL)
    offline = at_once.engine(model)
    with model.selections.recording() as calls:
        offline.generate(*zip(*at_once.trace(model.config.vocab_size)))
    assert profile(at_once.engine(model), at_once)[1] == {k: c for k, c in calls.items() if c}
    assert _rows(first) != _rows(calls) and max(_rows(first)) < max(_rows(calls))  # no one prefill of every prompt


def test_the_serving_trace_is_the_benchs():
    w = ServingWorkload()
    trace = w.trace(1000)
    bench = trace_of(Shapes(), 1000)
    assert [(p, sp.max_tokens, sp.seed) for p, sp in trace] == [(p, sp.max_tokens, sp.seed) for p, sp in bench]
    assert (w.requests, w.prompt_range, w.new_range) == (Shapes().poisson_requests, Shapes().poisson_prompt,
                                                        Shapes().poisson_new)
    for bad, what in ((dict(requests=0), "requests must be >= 1"), (dict(prompt_range=(9, 4)), "prompt_range"),
                      (dict(arrivals_per_step=0.0), "arrivals_per_step must be > 0")):
        with pytest.raises(ValueError, match=what):
            ServingWorkload(**bad)


def test_cli_serve_writes_a_tuple_and_refuses_the_step_shape(tmp_path, capsys):
    path = save(hf_model("qwen2"), tmp_path / "m")
    out = tmp_path / "s.json"
    limits = [f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()]
    with pytest.raises(SystemExit):  # the bench's trace (prompts up to 512 + 256 new) does not fit LIMITS' context
        main(["--model", str(path), "--dtype", "float32", "--serve", "--no-check", "--repeats", "1", *limits,
              "--out", str(out)])
    assert "serving workload: 512 + 256 tokens exceed the deployment's context of 256" in capsys.readouterr().err
    assert main(["--model", str(path), "--dtype", "float32", "--serve", "--requests", "6", "--no-check",
                 "--repeats", "1", "--families", "log_softmax", "--max-context", "1024", "--max-batch", "64",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tuning for ServingWorkload(requests=6, prompt_range=(64, 512)" in text
    assert f"sha256 {CommitmentTuple.load(out).sha256()}" in text and "| log_softmax | 2 | 2 (100%) |" in text
    assert any(k.startswith("matmul") for k in json.loads(out.read_text())["sites"])  # the model's whole tuple
    for extra in (["--prompts", "4"], ["--new-tokens", "3", "--micro-batch", "2"], ["--recipe", "r.yaml"]):
        with pytest.raises(SystemExit):
            main(["--model", str(path), "--serve", *extra, "--out", str(out)])
        assert "cannot be given with it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(path), "--serve", "--arrivals-per-step", "0", "--out", str(out)])
    assert "arrivals_per_step must be > 0, got 0.0" in capsys.readouterr().err


def test_a_serves_check_reports_no_rescoring_phase():
    """A serve rescores nothing: the check's line gives its serve's phase alone (an RL step's gives both)."""
    from detent_rl.tune_report import TuneReport
    serve = TuneReport(default_s=2.0, measured_s=1.5, rounds=3, default_phases=(2.0, 0.0),
                       measured_phases=(1.5, 0.0), round_savings=[0.5, 0.4, 0.6]).render()
    assert "2.000 -> 1.500 s (generate 2.000 -> 1.500 s); saving measured" in serve and "rescore" not in serve
    step = TuneReport(default_s=2.0, measured_s=1.5, rounds=3, default_phases=(1.5, 0.5),
                      measured_phases=(1.2, 0.3), round_savings=[0.5, 0.4, 0.6]).render()
    assert "(generate 1.500 -> 1.200 s, rescore 0.500 -> 0.300 s)" in step
