"""Piecewise step graphs (rollout/step_graphs.py): a prefill or mixed step padded to a piece size gives the eager
step's bits in the pinned arms, and its padding rows write no real page; the stock arm's bits move with the
padding (the negative control). On the CPU the padded pieces run eagerly; on the GPU they are captured."""
from __future__ import annotations

import random

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.models.context import set_context
from detent_rl.models.runner import Span, step_inputs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.step_graphs import StepGraphs, step_sizes
from test_engine import _failures, _requests
from test_models import LIMITS, VOCAB, hf_model, save

PINNED = [("detent", torch.float32), ("detent", torch.bfloat16), ("det", torch.float32)]
PINNED_IDS = ["detent-fp32", "detent-bf16", "det-fp32"]


def test_step_sizes_cover_every_count_with_bounded_padding(tmp_path):
    sizes = step_sizes(8192)
    assert sizes[:8] == [16, 32, 48, 64, 80, 96, 112, 128] and sizes[-1] == 8192 and sizes == sorted(set(sizes))
    for n in range(1, 8193):
        b = next(s for s in sizes if s >= n)
        assert b - n < (16 if n <= 128 else 64 if n <= 1024 else 256), n
    assert step_sizes(8) == [16] and step_sizes(300)[-3:] == [192, 256, 304] and step_sizes(512)[-1] == 512
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    pieces = StepGraphs(model, model.allocate_kv_cache(2), 1, 8, capture=False)
    assert pieces.fits(16) and not pieces.fits(17)
    with pytest.raises(ValueError, match="a step of 17 tokens exceeds the largest piece size 16"):
        pieces.size_for(17)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        StepGraphs(model, model.allocate_kv_cache(2), 1, 8)
    with pytest.raises(ValueError, match="scratch page 2 is outside the cache's 2 pages"):
        StepGraphs(model, model.allocate_kv_cache(2), 2, 8, capture=False)


MODES = {"pieces": {"step_graphs": True}, "whole": {"full_steps": True}}  # piecewise, whole-step graphs


def _pieces_vs_eager(model, mode: str = "pieces") -> tuple[list[str], int]:
    """The same requests through plain engines and through engines with step graphs (`mode`: the pieces, or the
    whole-step graphs of rollout/full_steps.py), under three chunkings; a line per difference, and how many steps
    ran through the graphs of that mode."""
    prompts, params = _requests(6, seed=1)
    bad, pieced = [], 0
    for chunk, budget in ((64, None), (5, None), (16, 40)):
        plain = Engine(model, num_blocks=64, chunk_size=chunk, max_num_tokens=budget)
        engine = Engine(model, num_blocks=64, chunk_size=chunk, max_num_tokens=budget, **MODES[mode])
        want, got = plain.generate(prompts, params), engine.generate(prompts, params)
        pieced += sum((engine.steps.runs if mode == "pieces" else engine.steps.whole_runs).values())
        for i, (a, b) in enumerate(zip(want, got)):
            if (a.completion, a.logprobs) != (b.completion, b.logprobs):
                bad.append(f"chunk {chunk}, budget {budget}: request {i} differs through the {mode}")
        bad += [f"chunk {chunk}, budget {budget}: request {i}'s rescore differs"
                for i, s in enumerate(got) if engine.rescore(s) != s.logprobs]
    return bad, pieced


@pytest.mark.parametrize("arm,dtype", PINNED, ids=PINNED_IDS)
def test_pieces_give_the_eager_steps_bits_in_the_pinned_arms(tmp_path, arm, dtype):
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, dtype=dtype, **LIMITS)
    bad, pieced = _pieces_vs_eager(model)
    assert pieced > 0, "no step ran through the pieces"
    assert bad == []
    assert _failures(model, step_graphs=True) == []  # batch-invariant through the pieces too


def test_stock_pieces_move_the_bits(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", dtype=torch.float32, **LIMITS)
    bad, pieced = _pieces_vs_eager(model)
    # the padding itself moves them (not only the stock rescore, which differs from any rollout of this arm)
    assert pieced > 0 and any("through the pieces" in line for line in bad), \
        "negative control: the stock arm's padded steps kept every bit"


def _alone_vs_batched(model) -> list[str]:
    """Each request alone against the batch, reordered and chunked, every engine through the pieces; a line per
    request that differs."""
    prompts, params = _requests(6, seed=1)
    alone = [Engine(model, num_blocks=64, step_graphs=True).generate([p], [sp])[0] for p, sp in zip(prompts, params)]
    bad = []
    for chunk, order in ((64, [0, 1, 2, 3, 4, 5]), (5, [3, 5, 0, 1, 4, 2])):
        got = Engine(model, num_blocks=64, chunk_size=chunk, step_graphs=True).generate(
            [prompts[i] for i in order], [params[i] for i in order])
        bad += [f"chunk {chunk}: request {i} differs from itself alone" for i in range(6)
                if (got[order.index(i)].completion, got[order.index(i)].logprobs)
                != (alone[i].completion, alone[i].logprobs)]
    return bad


def test_corun_through_the_pieces_stays_batch_invariant(tmp_path):
    # CoRun's prefill is one request alone: its padded size is its own length's, whatever the batch
    model = load_model(save(hf_model("qwen2"), tmp_path), "corun", dtype=torch.float32, **LIMITS)
    assert _alone_vs_batched(model) == []
    stock = load_model(save(hf_model("qwen2"), tmp_path / "stock"), "stock", dtype=torch.float32, **LIMITS)
    assert _alone_vs_batched(stock), "negative control: the stock arm through the pieces kept every request's bits"


def _step(model, caches, pieces: StepGraphs | None, tokens: list[int], pages: list[int]) -> torch.Tensor:
    input_ids, positions, ctx = step_inputs(model, caches, [Span(tokens, 0, pages)])
    with torch.inference_mode(), set_context(ctx):
        return (pieces.forward if pieces is not None else model)(input_ids, positions).clone()


def _untouched_pages(model, scratch_slot: int | None) -> list[str]:
    """A 12-token step in page 0, then a 5-token step in page 1 (each padded to 16 rows): what changed outside
    the second step's own slots and the scratch page (page 7). `scratch_slot`: where the second step's padding
    rows' keys go (None: the scratch page's first slot)."""
    rng = random.Random(0)
    caches = model.allocate_kv_cache(8)
    pieces = StepGraphs(model, caches, 7, 64, capture=False)
    _step(model, caches, pieces, [rng.randrange(VOCAB) for _ in range(12)], [0])
    before = [(k.clone(), v.clone()) for k, v in caches]
    if scratch_slot is not None:
        pieces.scratch_slot = scratch_slot
    second = [rng.randrange(VOCAB) for _ in range(5)]
    hidden = _step(model, caches, pieces, second, [1])
    bad = []
    for layer, ((k0, v0), (k1, v1)) in enumerate(zip(before, caches)):
        for page in (0, *range(2, 7)):
            if not (torch.equal(k0[page], k1[page]) and torch.equal(v0[page], v1[page])):
                bad.append(f"layer {layer}: page {page} changed")
        if not torch.equal(k1[1, 5:], k0[1, 5:]):
            bad.append(f"layer {layer}: page 1 past the step's 5 slots changed")
    fresh = model.allocate_kv_cache(8)
    if not torch.equal(hidden, _step(model, fresh, None, second, [1])):
        bad.append("the padded step's hidden states differ from the eager forward's")
    return bad


def test_padding_rows_write_only_the_scratch_page(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    assert _untouched_pages(model, None) == []
    # control: the second step's padding rows sent to a real page's slot (page 0's 14th, past the first step's 12):
    # the check sees the write. (Sent to one of the first step's own slots, they may write the very keys it wrote:
    # a padding row holds a stale row of the step before, token, position and attention output alike.)
    assert any("page 0 changed" in line for line in _untouched_pages(model, 13)), \
        "negative control: the check missed padding rows writing a real page"


def test_engine_runs_a_step_over_the_largest_piece_eagerly(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    engine = Engine(model, num_blocks=64, chunk_size=64)
    engine.steps = StepGraphs(model, engine.caches, 64, 16, capture=False)  # steps of more tokens run eagerly
    prompts, params = _requests(6, seed=1)
    got = engine.generate(prompts, params)
    want = Engine(model, num_blocks=64, chunk_size=64).generate(prompts, params)
    assert [(s.completion, s.logprobs) for s in got] == [(s.completion, s.logprobs) for s in want]
    assert set(engine.steps.runs) == {16}


def test_warmup_plans_the_linears_at_the_padded_count(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    plain = Engine(model, num_blocks=64, chunk_size=64).warmup()
    pieced = Engine(model, num_blocks=64, chunk_size=64, step_graphs=True)
    report = pieced.warmup()
    assert report["graphs"] == 0  # the CPU captures nothing
    assert report["steps"] <= plain["steps"]  # the padded counts are fewer classes, never more
    prompts, params = _requests(6, seed=1)
    want = Engine(model, num_blocks=64, chunk_size=64).generate(prompts, params)
    assert [s.logprobs for s in pieced.generate(prompts, params)] == [s.logprobs for s in want]


# ---------------------------------------------------------------------------------------------
# GPU: captured pieces

@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arm,dtype", [("detent", torch.bfloat16), ("detent", torch.float32), ("det", torch.bfloat16)],
                         ids=["detent-bf16", "detent-fp32", "det-bf16"])
def test_gpu_captured_pieces_give_the_eager_steps_bits(tmp_path, arm, dtype, mode):
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, device="cuda", dtype=dtype, **LIMITS)
    bad, pieced = _pieces_vs_eager(model, mode)
    assert pieced > 0 and bad == []
    assert _failures(model, **MODES[mode]) == []


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_gpu_stock_captured_pieces_stay_batch_dependent(tmp_path, mode):
    # the stock arm with the same graphs (vLLM V1's piecewise graphs; whole-step graphs as a stock engine's full
    # graphs): its bits move with the padding or the batch
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", device="cuda", dtype=torch.float32, **LIMITS)
    bad, pieced = _pieces_vs_eager(model, mode)
    assert pieced > 0
    assert bad + _failures(model, **MODES[mode]), "negative control: the stock arm kept every request's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_gpu_warmup_captures_every_piece_size_and_release_recaptures(tmp_path, mode):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", device="cuda", dtype=torch.bfloat16, **LIMITS)
    engine = Engine(model, num_blocks=64, chunk_size=64, **MODES[mode])
    engine.warmup()

    def graphs() -> dict:  # size -> the pieces' graphs, or the whole step's graph
        return engine.steps.graphs if mode == "pieces" else engine.steps.whole
    assert set(graphs()) == set(engine.steps.sizes)
    prompts, params = _requests(6, seed=1)
    captured = dict(graphs())
    first = engine.generate(prompts, params)
    assert graphs().keys() == captured.keys() and all(graphs()[b] is g for b, g in captured.items()), \
        "captured while serving"
    if mode == "pieces":
        assert all(len(g) == model.config.num_hidden_layers + 1 for g in engine.steps.graphs.values())
    else:
        assert engine.steps.graphs == {}  # every step took its whole graph: no piece was needed
    engine.release_memory()
    assert graphs() == {}
    again = engine.generate(prompts, params)
    assert [(s.completion, s.logprobs) for s in again] == [(s.completion, s.logprobs) for s in first]


def test_the_recipe_switch_is_on_where_decode_graphs_are_captured(tmp_path):
    """`rollout.step_graphs`: auto is on for a CUDA engine with decode graphs, off on the CPU and with
    `cuda_graphs: off`; on/off are as written, and a recipe that still says true/false reads as on/off (the
    option was a boolean before session 36); any other value is refused naming the key."""
    from detent_rl.config import parse_recipe
    from detent_rl.recipe_schema import RecipeError
    base = {"run": {"name": "t"}, "model": {"builtin": "tiny"}, "data": {"source": "reasoning_gym:basic_arithmetic"}}

    def rollout(**section):
        return parse_recipe({**base, "rollout": section}).rollout

    auto = rollout()
    assert auto.step_graphs == "auto" and auto.pieces("cuda") and not auto.pieces("cpu")
    assert auto.whole("cuda") and not auto.whole("cpu")  # auto: whole-step graphs where the step graphs are on
    assert not rollout(cuda_graphs="off").pieces("cuda") and not rollout(cuda_graphs="off").whole("cuda")
    assert rollout(step_graphs="on").pieces("cpu") and not rollout(step_graphs="off").pieces("cuda")
    assert rollout(step_graphs=True).step_graphs == "on" and rollout(step_graphs=False).step_graphs == "off"
    with pytest.raises(RecipeError, match=r"rollout\.step_graphs: expected one of 'auto', 'on', 'off', 'whole', "
                                          r"got 'yes'"):
        rollout(step_graphs="yes")
    with pytest.raises(RecipeError, match=r"run\.arm: expected one of .*got True"):  # a switch without on/off
        parse_recipe({**base, "run": {"name": "t", "arm": True}})
