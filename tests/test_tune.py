"""The tuner: every matmul site gets a legal K partition from timing, the tuple loads in engine and
trainer alike, and the tuned engine keeps its invariance (rollout == rescore, alone == batched)."""
from __future__ import annotations

import json

import pytest
import torch

from detent_rl.kernels.commitment import CommitmentError, CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.layers import Linear
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.tune import main, tune_matmul
from test_models import LIMITS, hf_model, save, sequences


def test_tuned_tuple_is_legal_loadable_and_keeps_invariance(tmp_path):
    path = save(hf_model("qwen2"), tmp_path / "m")
    model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
    before = model.selections.resolved()
    lines = []
    tuned = tune_matmul(model, {4: 8.0, 100: 1.0}, repeats=1, log=lines.append, head_rows={4: 9.0})
    matmul_sites = {k for k in tuned.sites if k.startswith("matmul")}
    assert matmul_sites and len(lines) == len(matmul_sites)
    for n, k in {tuple(m.weight.shape) for m in model.modules() if isinstance(m, Linear)}:
        sol = model.selections.solution("matmul", n=n, k=k)  # a legal partition (none where K is one chunk)
        assert tuned.sites[f"matmul[k={k}][n={n}]"].pins.get("chunk") in sol.candidates.get("chunk", (None,))
    # a new tuple: every site of the model, the others at the model's values; the model is untouched
    assert set(tuned.sites) == set(before.sites) and tuned.deployment == before.deployment
    assert all(tuned.sites[k] == before.sites[k] for k in set(before.sites) - matmul_sites)
    assert model.selections.commitment is None and model.selections.resolved() == before
    tuned.save(tmp_path / "t.json")
    again = load_model(path, "detent", dtype=torch.float32, commitment=CommitmentTuple.load(tmp_path / "t.json"),
                       **LIMITS)
    prompts = sequences(3, (5, 20, 37))
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=5) for i in range(3)]
    batched = Engine(again, num_blocks=32).generate(prompts, params)
    for p, sp, b in zip(prompts, params, batched):
        alone = Engine(again, num_blocks=32).generate([p], [sp])[0]
        assert (alone.completion, alone.logprobs) == (b.completion, b.logprobs)
        assert Engine(again, num_blocks=32).rescore(b) == b.logprobs


def test_cli_and_its_errors(tmp_path, capsys):
    path = save(hf_model("qwen2"), tmp_path / "m")
    out = tmp_path / "t.json"
    assert main(["--model", str(path), "--dtype", "float32", "--rows", "4:2,64:1", "--repeats", "1",
                 "--out", str(out)]) == 0
    assert any(k.startswith("matmul") for k in json.loads(out.read_text())["sites"])
    assert f"sha256 {CommitmentTuple.load(out).sha256()}" in capsys.readouterr().out
    # tuned for the default limits: a run with other limits refuses it; tuned with the run's, it loads
    with pytest.raises(CommitmentError, match="deployment: max_context: tuple 4096, model 256; max_batch: tuple 256, "
                                              "model 16; max_num_tokens: tuple 8192, model 512 "):
        load_model(path, "detent", dtype=torch.float32, commitment=CommitmentTuple.load(out), **LIMITS)
    assert main(["--model", str(path), "--dtype", "float32", "--rows", "4:1", "--repeats", "1", "--out", str(out),
                 *(f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items())]) == 0
    load_model(path, "detent", dtype=torch.float32, commitment=CommitmentTuple.load(out), **LIMITS)
    with pytest.raises(SystemExit):
        main(["--model", str(path), "--rows", "4-2", "--out", str(out)])
    assert "expected M:weight" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--recipe", "r.yaml", "--max-batch", "8", "--out", str(out)])
    assert "--recipe sets the deployment limits; max_batch cannot be given with it" in capsys.readouterr().err
    stock = load_model(path, "stock", dtype=torch.float32, **LIMITS)
    with pytest.raises(ValueError, match="detent arm"):
        tune_matmul(stock, {4: 1.0})
    with pytest.raises(ValueError, match="outside the deployment"):
        tune_matmul(load_model(path, "detent", dtype=torch.float32, **LIMITS), {100000: 1.0})
