"""Tensor parallelism in the run loop (Ray actors on the CPU): `model.tp_size`, and trainer and engines of
different degrees under `model.tp_invariant`, whose weights `ShardLayout` recuts. The model-level tests
(ranks in one process group, the all-reduce, the invariant mode) are tests/test_tensor_parallel.py."""
from __future__ import annotations

import json

import torch

from test_models import hf_model, save
from test_tensor_parallel import ALIGNED, LIMITS


def test_a_run_over_two_tp_ranks_is_bit_equal_and_resumes_to_the_same_bits(tmp_path):
    """The driver with `model.tp_size: 2`: one engine and the trainer, each two Ray actors in their own
    gloo group; every step bit-equal with KL 0 (GRPO's rescore and the bit-check on both trainer ranks),
    each trainer rank's part broadcast to its engine rank (a sync group per TP rank) and checked there; a
    run resumed from its step-3 checkpoint (a state file per rank), syncing by host copies instead,
    repeats steps 4-6 exactly. A model whose heads do not divide, or a degree the all-reduce has no
    tables for, is refused in one line before any worker starts. The engine ranks warm up first
    (`rollout.warmup: on`: the same synthetic steps on both, their all-reduces paired), changing no bit."""
    from test_train import _driver, _lines, _recipe, assert_resume_repeats
    tp = ("model.tp_size=2", "ray.num_cpus=4")
    whole = tmp_path / "whole"
    _driver(_recipe(tmp_path, whole), *tp, "ray.weight_sync=collective", "rollout.warmup=on")  # warm-up: both ranks
    rows = _lines(whole, "metrics.jsonl")
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert all(r["bit_match"] == 1.0 and r["kl_k1"] == 0.0 for r in rows.values()), rows
    transport = {json.loads(x)["weight_sync"] for x in (whole / "metrics.jsonl").read_text().splitlines()}
    assert transport == {"collective"}
    digests = [r["weights_digest"] for r in rows.values()]
    assert len(set(digests)) == 6 and all(len(d.split(",")) == 2 for d in digests)  # a part per rank, moving
    workers = json.loads((whole / "workers.json").read_text())
    assert len(workers["rollout"]) == len(workers["trainer"]) == 2
    assert sorted(p.name for p in (whole / "checkpoints" / "step_000003" / "trainer.pt").iterdir()) == \
        ["tp_rank0.pt", "tp_rank1.pt"]
    assert_resume_repeats(tmp_path, whole, rows, *tp)
    bad = _driver(_recipe(tmp_path, tmp_path / "bad"), "model.tp_size=4", "ray.num_cpus=8", rc=2)
    assert "model.tp_size: 4: num_key_value_heads" in bad.err and "(2) does not divide over 4" in bad.err, bad.err
    bad = _driver(_recipe(tmp_path, tmp_path / "bad3"), "model.tp_size=3", "ray.num_cpus=6", rc=2)
    assert "model.tp_size: 3" in bad.err and "tables for [2, 4, 8] ranks" in bad.err, bad.err


def test_the_shard_layout_cuts_and_joins_as_the_loaders_do(tmp_path):
    """`ShardLayout` (what moves weights between degrees) against the loaders: each rank's part of a
    checkpoint, loaded by its own loaders, is the layout's cut of the one-GPU model's weights, and the
    parts join back into them (fused q/k/v and gate/up included)."""
    from detent_rl.models import load_model
    from detent_rl.models.parallel import TensorParallel
    from detent_rl.models.tp_invariant import ShardLayout
    path = save(hf_model("qwen2", **ALIGNED), tmp_path / "aligned")
    whole = {n: p.detach() for n, p in load_model(str(path), "detent", **LIMITS).named_parameters()}
    parts = []
    for rank in range(2):
        part_model = load_model(str(path), "detent", **LIMITS, tp=TensorParallel(rank, 2))
        layout = ShardLayout(part_model)
        loaded = {n: p.detach() for n, p in part_model.named_parameters()}
        cut = layout.split(whole, rank)
        assert list(cut) == list(loaded) and all(torch.equal(cut[n], loaded[n]) for n in loaded)
        parts.append(loaded)
    joined = layout.join(parts)
    assert all(torch.equal(joined[n], whole[n]) for n in whole)


def test_a_trainer_and_engines_of_different_degrees_keep_every_bit(tmp_path):
    """`model.tp_invariant: true`: a two-rank trainer rescores and trains on a one-GPU engine's rollouts,
    and a one-GPU trainer on a two-rank engine's, every step bit-equal with KL 0; the weights are recut
    between the degrees and checked on the engines by the trainer's digests. Without tp_invariant such a
    run is refused (bits differ across degrees: test_tp_invariant_mode_gives_one_gpus_bits' control)."""
    from test_train import _driver, _lines, _recipe
    base = ("model.builtin=tiny-qwen2", "train.steps=3", "checkpoint.every=0", "ray.num_cpus=4")
    for trainer, engines in ((2, 1), (1, 2)):
        run = tmp_path / f"t{trainer}e{engines}"
        _driver(_recipe(tmp_path, run), *base, "model.tp_invariant=true", f"model.tp_size={trainer}",
                f"rollout.tp_size={engines}")
        rows = _lines(run, "metrics.jsonl")
        assert sorted(rows) == [1, 2, 3]
        assert all(r["bit_match"] == 1.0 and r["kl_k1"] == 0.0 for r in rows.values()), rows
        assert len({r["weights_digest"] for r in rows.values()}) == 3
        assert (run / "commitment_trainer.json").is_file()
    refused = _driver(_recipe(tmp_path, tmp_path / "refused"), *base, "model.tp_size=2", "rollout.tp_size=1", rc=2)
    assert "rollout.tp_size" in refused.err and "model.tp_invariant: true" in refused.err, refused.err
