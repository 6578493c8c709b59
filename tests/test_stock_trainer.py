"""The stock arm's trainer (`trainer.stock.StockTrainer`): transformers' model with fp32 masters, the
forward under autocast on the GPU. Its logprobs are transformers' (close to ours, not our bits: the
negative control of the bit-check), its update moves the policy with `Trainer`'s arithmetic, the
engine takes its weights under our names and checks them by digest, and its state resumes."""
from __future__ import annotations

import pytest
import torch

from detent_rl.config import RolloutSection, TrainSection
from detent_rl.models.runner import completion_logprobs
from detent_rl.trainer.stock import StockTrainer
from detent_rl.workers import ModelSpec, RolloutWorker, TrainerWorker
from test_models import LIMITS, hf_model, save
from test_trainer import _rollout


def _spec(path, dtype="float32"):
    return ModelSpec(str(path), "stock", "cpu", dtype, **LIMITS)


def _advantaged(model):
    samples = _rollout(model)
    for s, a in zip(samples, (1.0, -1.0, 0.5, 0.0, 2.0, -2.0)):
        s.advantage = a
    return samples


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_stock_logprobs_are_transformers_and_close_to_ours_not_equal(tmp_path, family):
    path = save(hf_model(family), tmp_path)
    trainer = TrainerWorker(_spec(path), TrainSection(lr=1e-3, micro_batch_size=4))
    assert isinstance(trainer.trainer, StockTrainer)
    engine = RolloutWorker(_spec(path), RolloutSection(prompts_per_step=1, samples_per_prompt=1, max_new_tokens=4))
    samples = _advantaged(engine.model)
    got = trainer.rescore(samples)
    hf = trainer.trainer.hf
    for s, lp in zip(samples, got):  # transformers, one sequence at a time, no padding
        with torch.no_grad():
            logits = hf(torch.tensor([s.tokens])).logits[0, s.num_prompt - 1:-1].float()
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.tokens[s.num_prompt:])[:, None])[:, 0]
        assert torch.allclose(lp, want, atol=1e-5)
    ours = completion_logprobs(engine.model, [(s.tokens, s.num_prompt) for s in samples], [1.0] * len(samples))
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, ours))
    # the control: the stock trainer does not reproduce the rollout's bits (bf16 engine, fp32 masters)
    bf16 = RolloutWorker(_spec(path, "bfloat16"), RolloutSection(prompts_per_step=1, samples_per_prompt=1))
    rolled = _advantaged(bf16.model)
    assert [t.tolist() for t in TrainerWorker(_spec(path, "bfloat16"), TrainSection()).rescore(rolled)] != \
        [s.rollout_logprobs for s in rolled]


def test_stock_update_moves_the_policy_and_syncs_by_digest(tmp_path):
    path = save(hf_model("qwen2"), tmp_path)
    trainer = TrainerWorker(_spec(path), TrainSection(lr=1e-3, micro_batch_size=2))
    engine = RolloutWorker(_spec(path), RolloutSection(prompts_per_step=1, samples_per_prompt=1, max_new_tokens=4))
    samples = _advantaged(engine.model)
    stats, old = trainer.train_checked(samples)
    assert stats.first_minibatch_ratio_ones == 1.0 and stats.train_tokens == sum(len(o) for o in old)
    after = trainer.rescore(samples)
    gain = [float((a - o).sum()) for a, o in zip(after, old)]
    assert gain[0] > 0 and gain[4] > 0 and gain[5] < 0, gain
    before = engine.update_weights(trainer.weights("host"))  # our names, fused shards, digest checked
    moved = completion_logprobs(engine.model, [(s.tokens, s.num_prompt) for s in samples], [1.0] * len(samples))
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(after, moved)), "the engine runs the new weights"
    assert len(before) == 32


def test_stock_state_round_trip_continues_identically(tmp_path):
    path = save(hf_model("qwen2"), tmp_path)
    cfg = TrainSection(steps=3, lr=1e-3, lr_schedule="cosine", warmup_steps=1, micro_batch_size=3)
    engine = RolloutWorker(_spec(path), RolloutSection(prompts_per_step=1, samples_per_prompt=1, max_new_tokens=4))
    samples = _advantaged(engine.model)
    a = TrainerWorker(_spec(path), cfg)
    a.train_checked(samples)
    a.save_state(tmp_path / "state.pt")
    b = TrainerWorker(_spec(path), cfg)
    b.load_state(tmp_path / "state.pt")
    assert a.weights().digest == b.weights().digest
    sa, sb = a.train_checked(samples)[0], b.train_checked(samples)[0]
    assert sa == sb and a.weights().digest == b.weights().digest


def test_stock_trainer_turns_dropout_off_and_checkpointing_keeps_the_step(tmp_path):
    """transformers' model trains in training mode (its layer checkpointing needs it), so dropout is
    switched off, as TRL's GRPO does: with a dropout-configured checkpoint, two rescores agree bit for bit,
    and the step with per-layer checkpointing is the step without it."""
    path = save(hf_model("qwen2", attention_dropout=0.5), tmp_path)
    engine = RolloutWorker(_spec(path), RolloutSection(prompts_per_step=1, samples_per_prompt=1, max_new_tokens=4))
    samples = _advantaged(engine.model)
    steps = []
    for checkpointing in (False, True):
        trainer = TrainerWorker(_spec(path), TrainSection(lr=1e-3, micro_batch_size=2,
                                                         activation_checkpointing=checkpointing))
        assert trainer.trainer.hf.training
        first, again = trainer.rescore(samples), trainer.rescore(samples)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        stats, _ = trainer.train_checked(samples)
        steps.append((stats, trainer.weights().digest))
    assert steps[0] == steps[1]
