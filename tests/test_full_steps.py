"""Whole-step graphs (rollout/full_steps.py): a prefill or mixed step through one graph of the whole forward,
attention inside over the size's most tiles, gives the eager step's bits in the pinned arms; the stock arm's bits
move with the padding (the negative control). The staged metadata is `attn_meta`'s, padded with the idle request.
On the CPU the padded step runs eagerly; the captured graphs' GPU tests are tests/test_step_graphs.py's, mode
"whole"."""
from __future__ import annotations

import random

import pytest
import torch

from detent_rl.kernels.attention import attn_meta
from detent_rl.models import load_model
from detent_rl.models.runner import Span
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.full_steps import FullStepGraphs
from test_engine import _failures, _requests
from test_models import LIMITS, hf_model, save
from test_step_graphs import PINNED, PINNED_IDS, _pieces_vs_eager


@pytest.mark.parametrize("arm,dtype", PINNED, ids=PINNED_IDS)
def test_whole_steps_give_the_eager_steps_bits_in_the_pinned_arms(tmp_path, arm, dtype):
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, dtype=dtype, **LIMITS)
    bad, whole = _pieces_vs_eager(model, "whole")
    assert whole > 0, "no step ran through the whole graphs"
    assert bad == []
    assert _failures(model, full_steps=True) == []  # batch-invariant through the whole graphs too


def test_stock_whole_steps_move_the_bits(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", dtype=torch.float32, **LIMITS)
    bad, whole = _pieces_vs_eager(model, "whole")
    assert whole > 0 and any("through the whole" in line for line in bad), \
        "negative control: the stock arm's padded whole steps kept every bit"


def _spans(rng: random.Random, page: int, requests: int, most: int) -> list[Span]:
    spans, at = [], 0
    for _ in range(requests):
        cached = rng.choice([0, rng.randrange(1, 60)])
        n = rng.choice([1, 1, rng.randrange(1, most)])
        pages = -(-(cached + n) // page) + rng.randrange(2)
        spans.append(Span([rng.randrange(100) for _ in range(n)], cached, list(range(at, at + pages))))
        at += pages
    return spans


def test_staged_metadata_is_attn_metas_padded_with_the_idle_request(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    graphs = FullStepGraphs(model, model.allocate_kv_cache(80), 79, 64, 5, capture=False)
    rng, page = random.Random(3), model.page_size
    for trial in range(40):
        spans = _spans(rng, page, rng.randrange(1, 6), 20)
        if sum(len(s.tokens) for s in spans) > 64:
            continue
        assert graphs.takes(spans)
        n, b = graphs._stage(spans)
        graphs._upload()
        per, grid = graphs.tiles(b)
        block_m, pack = model.attention_tiling(graphs.selection(b))
        width = max(len(s.pages) for s in spans)
        table = torch.tensor([s.pages + [0] * (width - len(s.pages)) for s in spans], dtype=torch.int32)
        want = attn_meta([len(s.tokens) for s in spans], [s.cached for s in spans], table, block_m, pack)
        B, tiles = len(spans), want.tile_req.shape[0]
        assert tiles <= grid, (trial, tiles, grid)
        assert graphs.cu_q[:B + 1].tolist() == want.cu_q.tolist() and set(graphs.cu_q[B + 1:].tolist()) == {n}
        assert graphs.pos0[:B].tolist() == want.pos0.tolist() and set(graphs.pos0[B:].tolist()) == {0}
        assert graphs.positions[:n].tolist() == want.token_pos.tolist() and set(graphs.positions[n:b].tolist()) <= {0}
        assert graphs.tile_req[:tiles].tolist() == want.tile_req.tolist()
        assert graphs.tile_q0[:tiles].tolist() == want.tile_q0.tolist()
        assert set(graphs.tile_req[tiles:grid].tolist()) <= {B} and set(graphs.tile_q0[tiles:grid].tolist()) <= {n}
        assert graphs.input_ids[:n].tolist() == [t for s in spans for t in s.tokens]
        slots = [s.pages[p // page] * page + p % page for s in spans for p in range(s.cached, s.cached + len(s.tokens))]
        assert graphs.slots[:n].tolist() == slots and set(graphs.slots[n:b].tolist()) <= {graphs.scratch_slot}


def test_grid_holds_every_step_of_its_size(tmp_path):
    # sum(ceil(q / per)) <= ceil(b / per) + requests for any split of b rows among the requests
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    graphs = FullStepGraphs(model, model.allocate_kv_cache(4), 3, 64, 9, capture=False)
    rng = random.Random(0)
    for b in graphs.sizes:
        per, grid = graphs.tiles(b)
        for _ in range(200):
            k = rng.randrange(1, min(9, b) + 1)
            cuts = sorted(rng.sample(range(1, b), k - 1)) if k > 1 else []
            q = [e - s for s, e in zip([0] + cuts, cuts + [b])]
            assert sum(-(-x // per) for x in q) <= grid, (b, q, per, grid)
        worst = [per + 1] * min(9, b // (per + 1)) or [b]  # rows just past a tile each
        assert sum(-(-x // per) for x in worst) <= grid


def test_whole_graphs_refuse_what_they_cannot_hold(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    graphs = FullStepGraphs(model, model.allocate_kv_cache(200), 199, 32, 2, capture=False)
    one = Span([1, 2, 3], 0, [0])
    assert graphs.takes([one, one]) and not graphs.takes([one] * 3)  # two request slots and the idle one
    assert not graphs.takes([Span(list(range(33)), 0, [0, 1, 2])])  # past the largest size
    wide = list(range(graphs.max_pages + 1))
    assert graphs.takes([Span([1], 0, wide)])  # a table wider than its keys: the pages they fill are staged
    assert not graphs.takes([Span([1], graphs.max_pages * model.page_size, wide)])  # keys past the context's pages
    assert not graphs.takes([])
    with pytest.raises(ValueError, match="span 0: 20 positions do not fit its 1 pages"):
        graphs._stage([Span([1] * 4, 16, [0])])


def test_engine_falls_back_to_the_pieces_past_the_request_slots(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    prompts, params = _requests(6, seed=1)
    want = Engine(model, num_blocks=64, chunk_size=64).generate(prompts, params)
    engine = Engine(model, num_blocks=64, chunk_size=64, full_steps=True)
    engine.steps.requests = 3  # steps of 3 or more sequences take the pieces
    got = engine.generate(prompts, params)
    assert [(s.completion, s.logprobs) for s in got] == [(s.completion, s.logprobs) for s in want]
    assert sum(engine.steps.whole_runs.values()) > 0 and sum(engine.steps.runs.values()) > 0


# ---------------------------------------------------------------------------------------------
# GPU: an eager step's launches read nothing back before its tokens

@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["pieces", "whole"])
def test_gpu_an_eager_step_launches_without_reading_the_device(tmp_path, mode):
    """The forward (through the pieces or a whole-step graph), the LM head and the sampler of RL's usual rows are
    launched with no host synchronisation (the tokens' read is the step's one); control: rows with top-k take
    `sample`, whose value checks read the device, and the same detector sees it."""
    from detent_rl.rollout.sequence import SamplingParams
    from detent_rl.rollout.warmup import synthetic_spans
    from test_step_graphs import MODES
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", device="cuda", dtype=torch.bfloat16, **LIMITS)
    engine = Engine(model, num_blocks=64, chunk_size=64, **MODES[mode])
    spans = synthetic_spans(engine, [1, 1, 1, 9], [20, 30, 40, 0], 4)  # three decode rows beside a prefill
    engine._step(spans)  # compiles, captures and records what the step needs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert engine._launch(spans) is not None
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for i, s in enumerate(spans):
        s.seq.params = SamplingParams(seed=i, top_k=5)
    engine._step(spans)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            engine._launch(spans)
    finally:
        torch.cuda.set_sync_debug_mode(0)
