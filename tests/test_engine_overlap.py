"""Overlapped decode: scheduling a step ahead of its predecessor's tokens changes no token and no
logprob — with stop tokens (whose rows in the step ahead are discarded), requests waiting for a slot,
lengths that end mid-batch and pages opened ahead. On the CPU the decode graphs run uncaptured (the
same staging, the same padded step, eagerly); tests/test_engine.py runs the captured ones on the GPU."""
from __future__ import annotations

import random

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.rollout.cuda_graph import DecodeGraphs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import PENDING, SamplingParams, Status
from test_models import LIMITS, VOCAB, hf_model, save


def _engine(model, overlap: bool, max_num_seqs: int, num_blocks: int) -> Engine:
    engine = Engine(model, num_blocks=num_blocks, max_num_seqs=max_num_seqs, chunk_size=32, overlap=overlap)
    if engine.graphs is None:  # the CPU: the graphs' staging and padded step, run eagerly
        engine.graphs = DecodeGraphs(model, engine.caches, len(engine.blocks.blocks), max_num_seqs, capture=False)
    return engine


def _run(model, prompts, params, overlap: bool, max_num_seqs: int, num_blocks: int = 96):
    """The requests run to the end: their sequences, whether each launch took its tokens from the
    device, the rows of steps ahead whose sequence had finished, and the preemptions."""
    engine = _engine(model, overlap, max_num_seqs, num_blocks)
    fired, ghosts, preempted = [], [], []
    fire, preempt = engine.graphs.fire, engine.scheduler._preempt

    def counting_fire(staged, feed=None):
        fired.append(feed is not None)
        return fire(staged, feed)

    def counting_preempt(seq):
        preempted.append(seq)
        preempt(seq)
    engine.graphs.fire, engine.scheduler._preempt = counting_fire, counting_preempt
    seqs = [engine.add(p, sp) for p, sp in zip(prompts, params)]
    finished = []
    while not engine.idle:
        finished += engine.step()
        if engine._inflight is not None:  # rows of the step ahead whose sequence has just finished
            ghosts += [s.seq for s in engine._inflight[0] if s.seq.status is Status.FINISHED]
    assert sorted(s.seq_id for s in finished) == sorted(s.seq_id for s in seqs), "every request finishes once"
    assert all(PENDING not in s.tokens for s in seqs)
    return seqs, fired, ghosts, len(preempted)


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cpu", torch.bfloat16),
                                          pytest.param("cuda", torch.bfloat16, marks=[pytest.mark.gpu, GPU])],
                         ids=["cpu-fp32", "cpu-bf16", "gpu-bf16"])
def test_overlapped_decode_gives_the_same_tokens_and_logprobs(tmp_path, device, dtype):
    """On the GPU the steps are captured graphs launched ahead of the host's read of their inputs."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=dtype, device=device, **LIMITS)
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 30))] for _ in range(7)]
    free = [SamplingParams(seed=50 + i, temperature=1.0, max_tokens=rng.randint(4, 20)) for i in range(7)]
    plain, *_ = _run(model, prompts, free, overlap=False, max_num_seqs=4)
    # a stop token every request would sample mid-way: the most common completion token
    counts = {}
    for s in plain:
        for t in s.completion[1:-1]:
            counts[t] = counts.get(t, 0) + 1
    stop = max(counts, key=counts.get)
    params = [SamplingParams(seed=p.seed, temperature=1.0, max_tokens=p.max_tokens, stop_token_ids=(stop,))
              for p in free]
    want, fired_plain, *_ = _run(model, prompts, params, overlap=False, max_num_seqs=4)
    got, fired, ghosts, _ = _run(model, prompts, params, overlap=True, max_num_seqs=4)
    for w, g in zip(want, got):
        assert g.completion == w.completion and g.logprobs == w.logprobs, (w.completion, g.completion)
    assert not any(fired_plain), "overlap off: no step is launched ahead"
    assert sum(fired) >= 4, f"overlap on: {sum(fired)} steps launched ahead of their tokens"
    assert any(s.completion[-1] == stop and len(s.completion) < s.params.max_tokens for s in want), \
        "the case must stop some requests on the token"
    assert ghosts and all(g.completion[-1] == stop for g in ghosts), \
        "some request stopped while the step ahead held its row (discarded)"


def test_overlap_under_page_pressure_and_shared_prompts(tmp_path):
    """GRPO's shape — samples of one prompt sharing its cached blocks — in a cache too small for all
    of them at once (requests preempted and recomputed): overlap on and off give the same tokens and
    logprobs, and the engine still launches steps ahead between the preemptions."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(37)] for _ in range(2)]
    reqs = [(prompts[i % 2], SamplingParams(seed=70 + i, temperature=1.0, max_tokens=24)) for i in range(8)]
    runs = []
    for overlap in (False, True):
        seqs, fired, _, preempted = _run(model, [p for p, _ in reqs], [sp for _, sp in reqs], overlap, 8, 14)
        runs.append(([s.completion for s in seqs], [s.logprobs for s in seqs], sum(fired), preempted))
    (want_t, want_lp, _, _), (got_t, got_lp, ahead, preempted) = runs
    assert got_t == want_t and got_lp == want_lp
    assert preempted > 0, "the cache must be small enough to preempt"
    assert ahead > 0, "steps between preemptions are launched ahead"
