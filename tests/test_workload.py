"""The tuner's workload (`detent_rl/workload.py`): one RL step's shapes as the run has them, so that a tuple is tuned
for the calls its run makes: GRPO groups prefilled once, the pieces' padded counts, the run's prefill chunks, the
trainer's micro-batches, one engine's share of the groups; a recipe's workload taken from the recipe."""
from __future__ import annotations

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.tune import Workload
from test_models import LIMITS, hf_model, save


def test_grpo_groups_prefill_each_prompt_once(tmp_path):
    """`samples` requests per prompt, as a GRPO step makes them: the prefix cache prefills the shared
    prompt once, so the tuner profiles the M values the run sees (distinct prompts prefill more)."""
    from detent_rl.tune import profile
    model = load_model(save(hf_model("qwen2"), tmp_path / "m"), "detent", dtype=torch.float32, **LIMITS)
    rows = {}
    for w in (Workload(2, 40, 2, micro_batch=2, samples=3), Workload(6, 40, 2, micro_batch=2)):
        assert w.requests == 6
        _, calls = profile(w.engine(model), w)
        key = next(k for k in calls if k.startswith("matmul"))
        rows[w.samples] = sum(args[0] * n for args, n in calls[key].items())
    assert rows[3] < rows[1] - 100  # two 40-token prompts prefilled, not six
    with pytest.raises(ValueError, match="samples must be >= 1"):
        Workload(2, 40, 2, samples=0)


def test_a_workload_with_step_graphs_profiles_the_padded_counts(tmp_path):
    """With `step_graphs` the prefill's linears run at the padded token count: the profile holds that count (a
    piece size), not the step's own, as the run will."""
    from detent_rl.tune import profile
    model = load_model(save(hf_model("qwen2"), tmp_path / "m"), "detent", dtype=torch.float32, **LIMITS)
    rows = {}
    for pieces in (False, True, "whole"):  # "whole": through whole-step graphs (rollout.step_graphs: whole)
        w = Workload(2, 37, 2, micro_batch=2, step_graphs=pieces)  # one prefill step of 74 tokens
        engine = w.engine(model)
        assert hasattr(engine.steps, "whole_runs") == (pieces == "whole")
        _, calls = profile(engine, w)
        rows[pieces] = {args[0] for k, c in calls.items() if k.startswith("matmul") for args in c}
    assert 74 in rows[False] and 80 not in rows[False]
    assert 80 in rows[True] and 74 not in rows[True]
    assert 80 in rows["whole"] and 74 not in rows["whole"]


def test_a_workloads_chunk_size_sets_its_prefill_shapes(tmp_path):
    """`chunk_size` (a run's rollout.chunk_size): the engine prefills a prompt in chunks of that many tokens, so the
    profile holds the chunks' token counts, as the run will (the tuner's engine once took the engine's default)."""
    from detent_rl.tune import profile
    model = load_model(save(hf_model("qwen2"), tmp_path / "m"), "detent", dtype=torch.float32, **LIMITS)
    rows = {}
    for chunk in (32, 256):
        w = Workload(1, 100, 2, micro_batch=1, chunk_size=chunk)
        _, calls = profile(w.engine(model), w)
        rows[chunk] = {args[0] for k, c in calls.items() if k.startswith("matmul") for args in c}
    assert {32, 4} <= rows[32] and 100 not in rows[32]  # 3 chunks of 32, then 4 (102 tokens rescored apart)
    assert 100 in rows[256] and 32 not in rows[256]
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        Workload(1, 100, 2, chunk_size=0)


def test_a_workloads_decode_pads_to_the_runs_slots(tmp_path):
    """The engine has the run's slots (`rollout.max_num_seqs`), not one per request: its decode graphs pad a batch to
    the sizes of those slots, so 5 requests in 8 slots decode at M = 8, as the run's do (the tuner's engine once had
    5 slots, and profiled M = 5)."""
    from detent_rl.rollout.cuda_graph import DecodeGraphs
    from detent_rl.tune import profile
    model = load_model(save(hf_model("qwen2"), tmp_path / "m"), "detent", dtype=torch.float32, **LIMITS)
    w = Workload(5, 20, 3, micro_batch=5, max_num_seqs=8)
    engine = w.engine(model)
    assert engine.scheduler.max_num_seqs == 8
    # the decode graphs' padded steps, run eagerly (the CPU has no graphs)
    engine.graphs = DecodeGraphs(model, engine.caches, len(engine.blocks.blocks), engine.scheduler.max_num_seqs,
                                 capture=False)
    _, calls = profile(engine, w)
    head = f"[n={model.config.vocab_size}]"  # the LM head runs on the prefill's 5 sampled rows: left out
    rows = {args[0] for k, c in calls.items() if k.startswith("matmul") and head not in k for args in c}
    assert rows == {100, 8, 115}  # the prefill's 5 x 20 tokens, the decode at the padded 8, the rescore's 5 x 23


def test_a_recipes_workload_rescores_in_the_trainers_micro_batches(tmp_path, monkeypatch):
    """`--recipe`: the workload's rescoring forwards are cut as the trainer cuts its micro-batches, by sequences
    (`train.micro_batch_size`) and by tokens (`train.max_tokens_per_micro_batch`): a recipe whose whole micro-batch
    of sequences is past the deployment's step, but whose token budget holds each sequence, is tuned, not refused
    (recipes/long_1.5b_random.yaml was: 8 sequences x 8,472 tokens against a 17,024-token step)."""
    import detent_rl.workload as workload_mod
    from detent_rl.tune import profile, recipe_workload
    overrides = ["model.builtin=tiny", "run.device=cpu", "data.template=plain", "rollout.prompts_per_step=8",
                 "rollout.samples_per_prompt=4", "rollout.max_num_seqs=32", "rollout.max_new_tokens=2",
                 "train.micro_batch_size=32", "train.max_tokens_per_micro_batch=200", "rollout.chunk_size=64",
                 "rollout.temperature=0.7", "rollout.top_p=0.9"]
    from detent_rl.config import RECIPES_DIR
    model, workload, _ = recipe_workload(str(RECIPES_DIR / "grpo_bf16.yaml"), overrides)
    d = model.selections.deployment
    assert workload.forward_tokens == 200 and workload.budget(d) == 200 and workload.chunk_size == 64
    assert workload.cuda_graphs is None  # rollout.cuda_graphs: auto
    assert (workload.temperature, workload.top_k, workload.top_p) == (0.7, 0, 0.9)  # the rollout's sampling
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        Workload(1, 4, 1, temperature=-1.0)
    # with engine replicas each engine's share of the groups is its workload (the first's: the most)
    _, shared, _ = recipe_workload(str(RECIPES_DIR / "grpo_bf16.yaml"), overrides + ["rollout.num_engines=3"])
    assert (shared.prompts, shared.samples, workload.prompts) == (3, 4, 8)
    _, eager, _ = recipe_workload(str(RECIPES_DIR / "grpo_bf16.yaml"), overrides + ["rollout.cuda_graphs=off"])
    assert eager.cuda_graphs is False and eager.step_graphs is False
    _, whole, _ = recipe_workload(str(RECIPES_DIR / "grpo_bf16.yaml"), overrides + ["rollout.step_graphs=whole"])
    assert whole.step_graphs == "whole"  # the run's engine takes whole-step graphs: so does the tuner's
    length = workload.prompt_len + workload.new_tokens
    assert workload.micro_batch * length > d.max_num_tokens  # what the old check refused
    workload.check(d)
    forwards = []

    def spy(model, seqs, temperatures, **kw):
        forwards.append([len(tokens) for tokens, _ in seqs])
        assert set(temperatures) == {0.7}  # rescored at the rollout's temperature, as the trainer does
        return real(model, seqs, temperatures, **kw)
    real = workload_mod.completion_logprobs
    monkeypatch.setattr(workload_mod, "completion_logprobs", spy)
    profile(workload.engine(model), workload)
    assert sum(len(f) for f in forwards) == workload.requests and len(forwards) > 1
    assert all(len(f) <= 32 and sum(f) <= 200 for f in forwards)
    # control: a sequence longer than a forward's budget is refused before anything runs, naming the numbers
    with pytest.raises(ValueError, match=f"a sequence of {workload.prompt_len} \\+ 2 tokens exceeds a trainer "
                                         f"forward's budget of 20 tokens"):
        Workload(8, workload.prompt_len, 2, forward_tokens=20).check(d)


def test_a_tuple_tuned_from_a_recipe_is_the_one_its_run_takes(tmp_path, capsys):
    """`python -m detent_rl.tune --recipe R` writes a tuple for R's deployment, and `python -m detent_rl.train R
    model.commitment=T` runs on it, every token bit-equal; control: a run of another deployment refuses it
    before any worker starts, naming the key."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from detent_rl.kernels.commitment import CommitmentTuple
    from detent_rl.tune import main
    from test_train import _recipe
    recipe = _recipe(tmp_path, tmp_path / "run")  # the tiny model's run of tests/test_train.py
    tuned = tmp_path / "t.json"
    assert main(["--recipe", str(recipe), "--no-check", "--families", "rmsnorm,log_softmax", "--repeats", "1",
                 "--out", str(tuned)]) == 0
    assert "tuning for Workload(prompts=2, " in capsys.readouterr().out
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "OMP_NUM_THREADS": "1"}

    def train(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "detent_rl.train", str(recipe), f"model.commitment={tuned}",
                               "train.steps=1", "checkpoint.every=0", "ray.mode=inline", *extra],
                              cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                              timeout=600)
    done = train()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    check = [json.loads(x) for x in (tmp_path / "run" / "bitcheck.jsonl").read_text().splitlines()]
    assert check[0]["bit_match"] == 1.0 and check[0]["tokens_compared"] > 0
    ran = CommitmentTuple.load(tmp_path / "run" / "commitment.json")
    assert ran.sites == CommitmentTuple.load(tuned).sites
    refused = train("model.max_context=256", f"run.dir={tmp_path / 'other'}")
    assert refused.returncode == 2 and f"{recipe}: model.commitment: commitment tuple {tuned} was made for another " \
        "deployment: max_context: tuple 192, model 256" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "other").exists()  # refused before the run started


@pytest.mark.parametrize("overrides, message", [
    (["run.arm=stock"], "run.arm: stock: the tuner commits the detent arm's pins"),
    (["model.tp_size=2"], "model.tp_size: 2: the tuner profiles one process, not a tensor-parallel group"),
    (["model.tp_invariant=true", "rollout.tp_size=2"], "rollout.tp_size: 2: the tuner profiles one process"),
    (["rollout.bogus=1"], "rollout.bogus: unknown key in override 'rollout.bogus=1'"),
])
def test_a_recipe_the_tuner_cannot_take_is_refused_in_one_line(tmp_path, capsys, overrides, message):
    """`--recipe`: what the run would refuse, and what the tuner cannot tune, stop before any model loads, in one
    line naming the recipe and the key (not a traceback)."""
    from detent_rl.tune import main
    from test_train import _recipe
    recipe = _recipe(tmp_path, tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        main(["--recipe", str(recipe), *overrides, "--out", str(tmp_path / "t.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"python -m detent_rl.tune: error: {recipe}: ") and message in err, err
