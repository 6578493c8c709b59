"""The GRPO trainer: advantages and loss arithmetic, ratio exactly 1.0 on the first minibatch, the
policy moving toward positive advantages, micro-batch accumulation, weight sync hashes, state."""
from __future__ import annotations

import math

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.config import LossSection, TrainSection
from detent_rl.models.runner import completion_logprobs
from detent_rl.models.weights import weights_sha256
from detent_rl.trainer.grpo import group_advantages, normalizer, stats_dict, tokens_loss
from detent_rl.trainer.accumulate import micro_batches
from detent_rl.trainer.trainer import Sample, Trainer
from test_models import LIMITS, VOCAB, hf_model, save, sequences


def test_group_advantages_grpo_and_dr_grpo():
    r = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0]
    assert group_advantages(r, 2, std=False) == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0]
    g = group_advantages(r, 2, std=True, eps=0.0 + 1e-6)
    assert g[0] == pytest.approx(1.0, rel=1e-5) and g[1] == pytest.approx(-1.0, rel=1e-5) and g[4] == 0.0
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_advantages(r, 4, std=True)


def sequence_loss(*args):
    loss, st = tokens_loss(*args)
    return loss, stats_dict(st)


def test_tokens_loss_ratio_clip_tis_and_kl():
    lp = torch.tensor([-1.0, -2.0, -0.5])
    cfg = LossSection(clip_low=0.2, clip_high=0.28)
    loss, st = sequence_loss(lp.clone(), lp.clone(), lp.clone(), 2.0, cfg)
    assert st["ratio_ones"] == 3 and loss.item() == -6.0  # ratio 1: -A per token
    new = lp + math.log(1.5)  # ratio 1.5 > 1.28: the clipped term is the min for A > 0
    loss, st = sequence_loss(new, lp, lp, 1.0, cfg)
    assert loss.item() == pytest.approx(-3 * 1.28) and st["clipped"] == 3
    loss, _ = sequence_loss(new, lp, lp, -1.0, cfg)  # A < 0: min picks the unclipped -1.5 * -1... i.e. 1.5
    assert loss.item() == pytest.approx(3 * 1.5)
    tis = LossSection(tis_cap=2.0)
    loss, _ = sequence_loss(lp.clone(), lp, lp - math.log(4.0), 1.0, tis)  # w = min(4, 2) = 2
    assert loss.item() == pytest.approx(-6.0)
    ref = lp - 0.1
    for est, want in (("k1", 0.1), ("k3", math.exp(-0.1) + 0.1 - 1)):
        loss, st = sequence_loss(lp.clone(), lp, lp, 0.0, LossSection(kl_coef=1.0, kl_estimator=est), ref)
        assert loss.item() == pytest.approx(3 * want, rel=1e-5)
    # a micro-batch's tokens end to end, one advantage per token: the sum of its sequences' losses
    both, st = tokens_loss(torch.cat([new, lp]), torch.cat([lp, lp]), torch.cat([lp, lp]),
                           torch.tensor([1.0] * 3 + [2.0] * 3), cfg)
    assert both.item() == pytest.approx(-3 * 1.28 - 6.0) and stats_dict(st)["tokens"] == 6
    assert stats_dict(st)["ratio_ones"] == 3 and stats_dict(st)["ratio_max"] == pytest.approx(1.5)
    assert (normalizer([3, 5], LossSection()) == 8
            and normalizer([3, 5], LossSection(aggregation="seq-mean-token-sum")) == 2)


def _rollout(model, n_prompts=2, group=3, max_tokens=6):
    prompts = sequences(11, tuple(9 + 7 * i for i in range(n_prompts)))
    params = [SamplingParams(seed=100 + i, temperature=1.0, max_tokens=max_tokens) for i in range(n_prompts * group)]
    seqs = Engine(model, num_blocks=64).generate([p for p in prompts for _ in range(group)], params)
    return [Sample(f"r{i}", s.tokens, s.num_prompt, s.logprobs, 1.0) for i, s in enumerate(seqs)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_first_minibatch_ratio_is_exactly_one_and_the_policy_moves(tmp_path, dtype):
    path = save(hf_model("qwen2"), tmp_path)
    model = load_model(path, "detent", dtype=dtype, **LIMITS)
    samples = _rollout(model)
    for s, a in zip(samples, group_advantages([1.0, 0.0, 0.0, 0.0, 1.0, 0.0], 3, std=True)):
        s.advantage = a
    trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=2, updates_per_batch=2))
    old = trainer.rescore(samples)
    assert [o.tolist() for o in old] == [s.rollout_logprobs for s in samples]  # bit-equal rescore
    before = weights_sha256(model)
    stats = trainer.train(samples, old)
    assert stats.first_minibatch_ratio_ones == 1.0, "the first minibatch's ratios must be exactly 1.0"
    assert weights_sha256(model) != before
    after = trainer.rescore(samples)
    gain = [float((a - o).sum()) for a, o in zip(after, old)]
    assert gain[0] > 0 and gain[4] > 0, "positive-advantage samples must become more likely"
    # the engine receives exactly the compute weights
    engine_model = load_model(path, "detent", dtype=dtype, **LIMITS)
    Engine(engine_model, num_blocks=8).update_weights(trainer.compute_weights())
    assert weights_sha256(engine_model) == weights_sha256(model)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_micro_batches_accumulate_to_the_whole_minibatch(tmp_path):
    path = save(hf_model("qwen2"), tmp_path)
    results = []
    for micro in (1, 6):
        model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
        samples = _rollout(model)
        for s, a in zip(samples, (1.0, -1.0, 0.5, 0.0, 2.0, -2.0)):
            s.advantage = a
        trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=micro, grad_clip=0.0))
        grads, step = [], trainer.opt.step
        trainer.opt.step = lambda: grads.extend(m.grad.clone() for m in trainer.master) or step()
        stats = trainer.train(samples, trainer.rescore(samples))
        results.append((stats, grads))
    (a, ga), (b, gb) = results
    assert a.loss == pytest.approx(b.loss, rel=1e-5) and a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    assert len(ga) == len(gb) > 0
    assert all(torch.allclose(x, y, rtol=1e-4, atol=1e-7) for x, y in zip(ga, gb))


def test_state_round_trip_continues_identically(tmp_path):
    path = save(hf_model("qwen2"), tmp_path)

    def fresh():
        model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
        return model, Trainer(model, TrainSection(steps=4, lr=1e-3, lr_schedule="cosine", warmup_steps=1))

    model, trainer = fresh()
    samples = _rollout(model)
    for s, a in zip(samples, (1.0, -1.0, 0.5, 0.0, 2.0, -2.0)):
        s.advantage = a
    trainer.train(samples, trainer.rescore(samples))
    state = trainer.state_dict()
    model2, trainer2 = fresh()
    trainer2.load_state_dict(state)
    assert weights_sha256(model2) == weights_sha256(model)
    s1 = trainer.train(samples, trainer.rescore(samples))
    s2 = trainer2.train(samples, trainer2.rescore(samples))
    assert s1 == s2 and weights_sha256(model2) == weights_sha256(model)


def test_weights_sha256_sees_every_byte_name_dtype_and_shape():
    torch.manual_seed(0)
    w = {"a": torch.randn(64, 8).bfloat16(), "b": torch.randn(3), "c": torch.zeros(0), "d": torch.tensor(2.0)}
    base = weights_sha256(w)
    assert weights_sha256(dict(reversed(list(w.items())))) == base  # name order, not insertion order
    assert weights_sha256({k: v.clone() for k, v in w.items()}) == base
    flipped = w["a"].clone()
    flipped.view(torch.int16)[63, 7] ^= 1  # one bit of the last element
    changed = [{**w, "a": flipped}, {**w, "b": w["b"].double()}, {**w, "a": w["a"].reshape(8, 64)},
               {"x" if k == "a" else k: v for k, v in w.items()}, {k: v for k, v in w.items() if k != "c"}]
    hashes = [weights_sha256(c) for c in changed]
    assert base not in hashes and len(set(hashes)) == len(hashes)


def test_micro_batches_pack_by_tokens_in_order():
    lengths = [5, 9, 3, 3, 12, 1, 7]
    runs = micro_batches(lengths, 3, 12, list(range(7)))
    assert runs == [[0], [1, 2], [3], [4], [5, 6]]  # 5+9 > 12; 9+3; 3+12 > 12; 12; 1+7
    assert [i for r in runs for i in r] == list(range(7)) and all(sum(lengths[i] for i in r) <= 12 for r in runs)
    assert micro_batches(lengths, 2, 100, list(range(7))) == [[0, 1], [2, 3], [4, 5], [6]]  # the count cap
    with pytest.raises(ValueError, match="sample 4 has 12 tokens, more than a micro-batch's budget of 11"):
        micro_batches(lengths, 3, 11, list(range(7)))


def test_token_budget_micro_batches_keep_the_rescore_bits_and_train(tmp_path):
    """Sequences packed by a token budget (several per forward, or one) get the rollout's logprobs bit
    for bit, and the update runs on them with the first minibatch's ratios exactly 1."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, **LIMITS)
    samples = _rollout(model, n_prompts=3, group=2, max_tokens=8)
    for s, a in zip(samples, (1.0, -1.0, 0.5, -0.5, 1.0, -1.0)):
        s.advantage = a
    lengths = [len(s.tokens) for s in samples]
    for budget in (max(lengths), 2 * max(lengths) + 1, sum(lengths)):
        trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=6, max_tokens_per_micro_batch=budget))
        runs = trainer._micro(samples)
        assert all(sum(len(s.tokens) for s in r) <= budget for r in runs)
        assert [o.tolist() for o in trainer.rescore(samples)] == [s.rollout_logprobs for s in samples], budget
    assert len(runs) == 1 and len(Trainer(model, TrainSection(max_tokens_per_micro_batch=max(lengths)))
                                  ._micro(samples)) == len(samples)
    stats = trainer.train(samples, trainer.rescore(samples))
    assert stats.first_minibatch_ratio_ones == 1.0


def _backward(model, seqs, temps, kept, **kw):
    """completion_logprobs with grad, then a backward: (logprob lists, parameter grads, bytes of the
    saved tensors for which `kept(t)` holds, counted once per storage)."""
    for p in model.parameters():
        p.requires_grad_(True)
        p.grad = None
    saved = {}

    def pack(t):
        if kept(t):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = completion_logprobs(model, seqs, temps, **kw)
    sum((o * (i + 1)).sum() for i, o in enumerate(out)).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
        p.grad = None
    return [o.tolist() for o in out], grads, sum(saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_logits_in_row_blocks_keep_the_bits_and_free_the_logits(tmp_path, dtype):
    """completion_logprobs in blocks of 5 completion rows (the LM head and log-softmax recomputed per
    block in the backward) gives the unblocked logprobs bit for bit, with and without grad, gradients
    equal up to the backward's rounding, and keeps no [rows, vocab] logits for the backward: the
    unblocked pass saves them (control)."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=dtype, **LIMITS)
    seqs = [(t, p) for t, p in zip(sequences(4, (30, 19, 44)), (11, 7, 20))]  # 19 + 12 + 24 completion rows
    temps = [1.0, 0.7, 1.0]
    rows = sum(len(t) - p for t, p in seqs)
    with torch.no_grad():
        whole = completion_logprobs(model, seqs, temps, block_rows=rows)
        blocked = completion_logprobs(model, seqs, temps, block_rows=5)
    assert [a.tolist() for a in blocked] == [a.tolist() for a in whole]

    def logits(t):  # what the backward keeps of tensors over the vocabulary
        return t.dim() == 2 and t.shape[-1] == VOCAB
    out_w, grads_w, big_w = _backward(model, seqs, temps, logits, block_rows=rows)
    out_b, grads_b, big_b = _backward(model, seqs, temps, logits, block_rows=5)
    assert out_b == out_w == [a.tolist() for a in whole]
    # the LM head's weight gradient is summed over the blocks in the weights' dtype (bf16: ~1e-3 off)
    rel = 1e-5 if dtype == torch.float32 else 1e-2
    assert all((a.float() - b.float()).norm() <= rel * a.float().norm() for a, b in zip(grads_w, grads_b))
    logits_bytes = rows * VOCAB * dtype.itemsize
    assert big_w >= logits_bytes, "control: the unblocked pass keeps the whole logits for its backward"
    assert big_b == 0, f"blocked: {big_b} bytes of logits kept for the backward"


def test_activation_checkpointing_keeps_bits_and_gradients(tmp_path):
    """train.activation_checkpointing recomputes each layer in the backward with the same kernels:
    the same logprobs and the same gradients, bit for bit, and the backward keeps far fewer
    activations (the plain pass keeps every layer's: control)."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, **LIMITS)
    seqs = [(t, p) for t, p in zip(sequences(6, (40, 27)), (15, 9))]

    def run(recompute: bool):
        model.model.checkpoint_layers = recompute
        try:
            return _backward(model, seqs, [1.0, 1.0], lambda t: not isinstance(t, torch.nn.Parameter))
        finally:
            model.model.checkpoint_layers = False

    plain, grads, kept = run(False)
    again, grads_again, kept_again = run(True)
    assert again == plain
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_again))
    assert kept_again < kept / 2, (kept_again, kept)
    trainer = Trainer(model, TrainSection(activation_checkpointing=True))
    assert model.model.checkpoint_layers and trainer.cfg.activation_checkpointing


def test_free_bitcheck_is_the_rescored_step_bit_for_bit(tmp_path):
    """train_checked (one update per batch, no rescore pass) returns the rollout's logprobs, and its
    update equals rescore + train exactly: the same weights and statistics."""
    path = save(hf_model("qwen2"), tmp_path)
    results = []
    for free in (False, True):
        model = load_model(path, "detent", dtype=torch.bfloat16, **LIMITS)
        samples = _rollout(model)
        for s, a in zip(samples, (1.0, -1.0, 0.5, 0.0, 2.0, -2.0)):
            s.advantage = a
        trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=4))
        if free:
            stats, seen = trainer.train_checked(samples)
        else:
            seen = trainer.rescore(samples)
            stats = trainer.train(samples, seen)
        assert [o.tolist() for o in seen] == [s.rollout_logprobs for s in samples]
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (a, wa), (b, wb) = results
    assert a == b and all(torch.equal(x, y) for x, y in zip(wa, wb))
    with pytest.raises(ValueError, match="updates_per_batch is 2"):
        Trainer(model, TrainSection(updates_per_batch=2)).train_checked(samples)


@pytest.mark.gpu
def test_gpu_update_is_deterministic(tmp_path):
    """Two trainers from the same checkpoint, given the same batch, end with the same weights bit for
    bit on the GPU: the backward's kernels are deterministic (embedding gradient sorted by token, the
    attention reference's memory-efficient backward under PyTorch's deterministic algorithms, fused
    AdamW). Repeated tokens make the embedding gradient add several rows into one."""
    path = save(hf_model("qwen2"), tmp_path)
    shas = []
    for _ in range(2):
        model = load_model(path, "detent", device="cuda", dtype=torch.bfloat16, **LIMITS)
        samples = _rollout(model)
        for s, a in zip(samples, (1.0, -1.0, 0.5, 0.0, 2.0, -2.0)):
            s.advantage = a
            s.tokens = s.tokens[:3] * 4 + s.tokens[12:]  # many repeats of three tokens in the prompt
            s.num_prompt = len(s.tokens) - len(s.rollout_logprobs)
        trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=2))
        for s, o in zip(samples, trainer.rescore(samples)):
            s.rollout_logprobs = o.tolist()
        trainer.train(samples, trainer.rescore(samples))
        shas.append(weights_sha256(model))
    assert shas[0] == shas[1]


def test_a_sample_whose_rollout_logprobs_do_not_fit_is_refused_by_name(tmp_path):
    """A micro-batch's tokens go end to end through one loss: a sample with too few or too many
    rollout logprobs would shift every later one, so the update refuses it first, naming it."""
    path = save(hf_model("qwen2"), tmp_path)
    model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
    samples = _rollout(model)
    trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=6))
    samples[2].rollout_logprobs = samples[2].rollout_logprobs[:-1]
    with pytest.raises(ValueError, match="sample 2 \\(r2\\): 5 rollout logprobs for 6 completion tokens"):
        trainer.train_checked(samples)


def test_rollout_logprobs_as_logp_old_is_the_rescored_step_when_the_bits_match(tmp_path):
    """Several updates per batch without a rescore pass (`train.old_logprobs: rollout`): the rollout's
    logprobs are logp_old, the first minibatch's forward is returned for the bit-check. With the bits
    equal it is the rescored step bit for bit (weights and statistics); one rollout logprob off (the
    control) shows in the check and changes the step."""
    path = save(hf_model("qwen2"), tmp_path)
    cfg = TrainSection(lr=1e-3, micro_batch_size=2, updates_per_batch=2)
    results = []
    for variant in ("rescore", "rollout", "rollout, one logprob off"):
        model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
        samples = _rollout(model)
        for s, a in zip(samples, (1.0, -1.0, 0.5, 0.0, 2.0, -2.0)):
            s.advantage = a
        if variant.endswith("off"):
            samples[1].rollout_logprobs[2] -= 0.01
        trainer = Trainer(model, cfg)
        if variant == "rescore":
            stats, first = trainer.train(samples, trainer.rescore(samples)), None
        else:
            stats, first = trainer.train_rollout_old(samples)
            assert len(first) == 3  # the first minibatch: half of six samples
            equal = [f.tolist() == s.rollout_logprobs for f, s in zip(first, samples)]
            assert equal == ([True, False, True] if variant.endswith("off") else [True] * 3)
        results.append((stats, weights_sha256(model)))
    assert results[1] == results[0]
    assert results[2][1] != results[0][1]
