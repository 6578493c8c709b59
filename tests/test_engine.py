"""The engine: a request's tokens and logprobs do not depend on its batch, and rescore (the
trainer's one-shot prefill) equals the rollout's logprobs bit for bit; the stock arm does not."""
from __future__ import annotations

import random

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.rollout.cuda_graph import DecodeGraphs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from test_models import LIMITS, VOCAB, hf_model, save


def _requests(n: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(n)]
    params = [SamplingParams(seed=1000 + i, temperature=rng.choice([0.0, 0.7, 1.0]), top_k=rng.choice([0, 20]),
                             top_p=rng.choice([1.0, 0.9]), max_tokens=rng.randint(3, 12)) for i in range(n)]
    return prompts, params


def _failures(model, target: int = 0, **options) -> list[str]:
    """`options`: the batched engines' other options (the request alone always runs on a plain engine)."""
    prompts, params = _requests(6, seed=1)
    bad = []
    alone = Engine(model, num_blocks=64, chunk_size=64).generate([prompts[target]], [params[target]])[0]
    for label, engine, order in (
            ("batch of 6", Engine(model, num_blocks=64, chunk_size=64, **options), [0, 1, 2, 3, 4, 5]),
            ("other order, chunks of 5", Engine(model, num_blocks=64, chunk_size=5, **options), [3, 5, 0, 1, 4, 2]),
            ("budget of 8 tokens", Engine(model, num_blocks=64, max_num_tokens=8, chunk_size=8, **options),
             [2, 0, 4])):
        seqs = engine.generate([prompts[i] for i in order], [params[i] for i in order])
        got = seqs[order.index(target)]
        if got.completion != alone.completion:
            bad.append(f"{label}: tokens {got.completion} vs alone {alone.completion}")
        elif got.logprobs != alone.logprobs:
            bad.append(f"{label}: logprobs differ from the request alone")
    rescored = Engine(model, num_blocks=64).rescore(alone)
    if rescored != alone.logprobs:
        diffs = [i for i, (a, b) in enumerate(zip(rescored, alone.logprobs)) if a != b]
        bad.append(f"rescore differs from the rollout at completion positions {diffs}")
    return bad


@pytest.mark.parametrize("arm,dtype", [("detent", torch.float32), ("detent", torch.bfloat16),
                                       ("det", torch.float32)], ids=["detent-fp32", "detent-bf16", "det-fp32"])
def test_rollout_is_batch_invariant_and_rescore_matches(tmp_path, arm, dtype):
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, dtype=dtype, **LIMITS)
    assert _failures(model) == []


def test_update_weights_in_place_equals_loading_the_new_checkpoint(tmp_path):
    old_dir, new_dir = (save(hf_model("qwen2", seed=0), tmp_path / "old"),
                        save(hf_model("qwen2", seed=1), tmp_path / "new"))
    engine = Engine(load_model(old_dir, "detent", dtype=torch.float32, **LIMITS), num_blocks=64)
    prompt, sp = list(range(1, 40)), SamplingParams(seed=7, temperature=1.0, max_tokens=6)
    before = engine.generate([prompt], [sp])[0]
    assert engine.generate([prompt], [sp])[0].num_cached > 0  # the prompt's full blocks are cached
    new_model = hf_model("qwen2", seed=1)
    n = engine.update_weights({k: v for k, v in new_model.state_dict().items()})
    assert n == sum(len(getattr(p, "shard_ids", (0,))) for p in engine.model.parameters())  # every shard set
    after = engine.generate([prompt], [sp])[0]
    assert after.num_cached == 0, "update_weights must flush the prefix cache computed by the old weights"
    fresh = Engine(load_model(new_dir, "detent", dtype=torch.float32, **LIMITS),
                   num_blocks=64).generate([prompt], [sp])[0]
    assert (after.completion, after.logprobs) == (fresh.completion, fresh.logprobs)
    assert after.logprobs != before.logprobs
    # the model's own (fused) names work too, and bad input names what is wrong
    engine.update_weights(dict(engine.model.named_parameters()))
    with pytest.raises(ValueError, match=r"missing tensors \['lm_head.weight'\]|missing tensors \[.*norm"):
        engine.update_weights({k: v for k, v in new_model.state_dict().items() if "norm" not in k})
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj.weight: shape"):
        engine.update_weights({"model.layers.0.self_attn.q_proj.weight": torch.zeros(3, 3)}, strict=False)


def _release_and_resume(engine) -> list[str]:
    """The engine's KV cache freed between two generate calls (a colocated trainer's update in
    between), then the same requests again: what changed, if anything."""
    prompts, params = _requests(6, seed=3)
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)  # with the prefix cache warm
    assert any(s.num_cached for s in again)
    freed = engine.release_memory()
    bad = []
    held = sum(t.untyped_storage().nbytes() for kv in engine.caches for t in kv)
    if freed <= 0 or held:
        bad.append(f"release freed {freed} bytes and left {held}")
    after = engine.generate(prompts, params)
    if any(s.num_cached for s in after):
        bad.append("the prefix cache outlived the pages it pointed to")
    for label, seqs in (("warm", again), ("after release", after)):
        for a, b in zip(first, seqs):
            if (a.completion, a.logprobs) != (b.completion, b.logprobs):
                bad.append(f"{label}: a request's tokens or logprobs changed")
    return bad


def test_release_memory_frees_the_kv_cache_and_keeps_the_bits(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, **LIMITS)
    engine = Engine(model, num_blocks=64, chunk_size=16)
    assert _release_and_resume(engine) == []
    assert engine.release_memory() > 0 and engine.release_memory() == 0  # released once until the next step
    prompts, params = _requests(2, seed=4)
    seq = engine.add(prompts[0], params[0])
    engine.step()
    if not seq.finished:
        with pytest.raises(RuntimeError, match="in flight"):
            engine.release_memory()


@pytest.mark.gpu
def test_gpu_release_memory_recaptures_the_decode_graphs_with_the_same_bits(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, device="cuda", **LIMITS)
    engine = Engine(model, num_blocks=64, chunk_size=16, cuda_graphs=True)
    assert _release_and_resume(engine) == []
    assert engine.graphs.graphs, "decode ran from graphs captured again over the new cache"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_corun_rollout_is_batch_invariant_but_the_trainers_prefill_differs(tmp_path, dtype):
    # the CoRun arm: stock's selections held still by fixed shapes (prefill alone and whole, decode
    # padded to max_num_seqs): alone, batched, reordered, chunked or budgeted, a request keeps its bits;
    # the trainer's one-shot prefill selects otherwise than the rollout's decode, so rescore does not
    model = load_model(save(hf_model("qwen2"), tmp_path), "corun", dtype=dtype, **LIMITS)
    assert [f for f in _failures(model) if not f.startswith("rescore")] == []
    # past 64 keys the stock decode reads them in wider tiles than the prefill does: rescore differs
    long = Engine(model, num_blocks=64).generate([[(7 * i) % VOCAB for i in range(100)]],
                                                 [SamplingParams(seed=3, temperature=1.0, max_tokens=8)])[0]
    assert Engine(model, num_blocks=64).rescore(long) != long.logprobs
    engine = Engine(model, num_blocks=64)
    assert engine.graphs is not None and engine.graphs.sizes == [16] and not engine.blocks.prefix_cache
    prompt = [(5 * i) % VOCAB for i in range(40)]
    first, second = engine.generate([prompt, prompt], [SamplingParams(seed=1, max_tokens=3)] * 2)
    assert first.num_cached == second.num_cached == 0  # no prefix sharing: a prefill's shape is its own


def test_decode_graphs_restage_every_row_whose_pages_changed(tmp_path):
    # the staging keeps each page-table row between steps and rewrites only rows whose pages changed:
    # across steps whose rows move, shrink, grow a page or take other pages of the same count, a
    # reused DecodeGraphs gives a fresh one's logits (the same padded step, run eagerly on the CPU)
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    caches = model.allocate_kv_cache(41)
    gen = torch.Generator().manual_seed(0)
    for k, v in caches:
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    page = model.page_size
    a, b, c, d = [0, 1], [2], [3, 4, 5], [7, 8]  # d: as many pages as a, other ones
    steps = [[(a, 20), (b, 5), (c, 40)], [(c, 40), (a, 20)], [(a + [6], 32), (d, 20)],
             [(d, 20), (a + [6], 33), (b, 6), (c, 41), ([9, 10, 11, 12], 60)], [(b, 7)]]
    graphs = DecodeGraphs(model, caches, 40, LIMITS["max_batch"], capture=False)
    for rows in steps:
        tables = [t for t, _ in rows]
        positions = [p for _, p in rows]
        inputs = ([(3 * p) % VOCAB for p in positions], positions,
                  [t[p // page] * page + p % page for t, p in rows], tables)
        fresh = DecodeGraphs(model, caches, 40, LIMITS["max_batch"], capture=False).run(*inputs)
        assert torch.equal(graphs.run(*inputs), fresh), f"step {rows}"
    # the check can fail: the same-size swap of a's pages for d's changes the logits
    same_size = DecodeGraphs(model, caches, 40, LIMITS["max_batch"], capture=False)
    assert not torch.equal(same_size.run([5], [20], [a[1] * page + 4], [a]),
                           same_size.run([5], [20], [a[1] * page + 4], [d]))


@pytest.mark.gpu
def test_gpu_corun_rollout_is_batch_invariant_with_its_one_graph(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "corun", device="cuda", dtype=torch.bfloat16, **LIMITS)
    assert [f for f in _failures(model) if not f.startswith("rescore")] == []
    engine = Engine(model, num_blocks=64)
    engine.generate(*_requests(5, seed=2))
    assert {b for b, _ in engine.graphs.graphs} == {LIMITS["max_batch"]}  # one decode shape


def test_stock_arm_fails_the_same_checks(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", dtype=torch.float32, **LIMITS)
    assert _failures(model), "negative control: stock selection must change a request's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_rollout_is_batch_invariant_and_rescore_matches(tmp_path, dtype):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", device="cuda", dtype=dtype, **LIMITS)
    assert _failures(model) == []


@pytest.mark.gpu
def test_gpu_stock_arm_fails_the_same_checks(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", device="cuda", dtype=torch.float32, **LIMITS)
    assert _failures(model), "negative control: stock selection must change a request's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("arm,dtype", [("detent", torch.bfloat16), ("detent", torch.float32), ("det", torch.bfloat16)],
                         ids=["detent-bf16", "detent-fp32", "det-bf16"])
def test_gpu_decode_graphs_give_the_eager_bits(tmp_path, arm, dtype):
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, device="cuda", dtype=dtype, **LIMITS)
    prompts, params = _requests(11, seed=3)  # 11 sequences: padded to the size-16 graph, then fewer
    engine = Engine(model, num_blocks=64)
    graphed = engine.generate(prompts, params)
    assert engine.graphs is not None and engine.graphs.graphs, "decode steps must have replayed graphs"
    eager = Engine(model, num_blocks=64, cuda_graphs=False).generate(prompts, params)
    assert [(s.completion, s.logprobs) for s in graphed] == [(s.completion, s.logprobs) for s in eager]
    assert [engine.rescore(s) for s in graphed] == [s.logprobs for s in graphed]


@pytest.mark.gpu
@pytest.mark.parametrize("arm", ["detent", "det"])
def test_gpu_decode_graphs_sample_inside_the_graph(tmp_path, arm):
    # RL's decode: no top-k/top-p, one temperature (greedy rows take their logprob at 1.0): the graph
    # samples too, and gives the eager engine's tokens and logprobs bit for bit
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, device="cuda", dtype=torch.bfloat16, **LIMITS)
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(11)]
    for temps in ([1.0, 0.0] * 6, [0.7] * 12):
        params = [SamplingParams(seed=50 + i, temperature=temps[i], max_tokens=rng.randint(3, 12)) for i in range(11)]
        engine = Engine(model, num_blocks=64)
        graphed = engine.generate(prompts, params)
        sampled_in_graph = [key for key in engine.graphs.graphs if key[1] is not None]
        assert sampled_in_graph and {key[1] for key in sampled_in_graph} == {max(temps)}
        eager = Engine(model, num_blocks=64, cuda_graphs=False).generate(prompts, params)
        assert [(s.completion, s.logprobs) for s in graphed] == [(s.completion, s.logprobs) for s in eager]
        assert [engine.rescore(s) for s in graphed] == [s.logprobs for s in graphed]


@pytest.mark.gpu
def test_gpu_stock_arm_decodes_from_graphs_and_stays_batch_dependent(tmp_path):
    # the honest baseline: cuBLAS linears, graphs captured per padded size with the selection fixed at
    # capture — fast, and a request's bits still follow its batch (alone vs beside others)
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", device="cuda", dtype=torch.bfloat16, **LIMITS)
    engine = Engine(model, num_blocks=64)
    prompts, params = _requests(11, seed=3)
    batched = engine.generate(prompts, params)
    assert engine.graphs is not None and engine.graphs.graphs, "the stock arm must decode from graphs too"
    alone = [Engine(model, num_blocks=64).generate([p], [sp])[0] for p, sp in zip(prompts, params)]
    assert any(a.logprobs != b.logprobs for a, b in zip(alone, batched)), \
        "negative control: the stock arm's bits must follow the batch"


def test_a_group_sharing_its_prompt_under_chunked_prefill_matches_each_sample_alone(tmp_path):
    """GRPO's shape: samples of one prompt admitted together share its blocks as each chunk is
    computed — never a block whose chunk is still to come (that read unwritten keys once)."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    prompt = [(7 * i) % VOCAB for i in range(100)]
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=4) for i in range(4)]
    group = Engine(model, num_blocks=64, chunk_size=16, max_num_tokens=64).generate([prompt] * 4, params)
    assert [s.num_cached for s in group] == [0, 16, 32, 48]  # each later sample shares the chunks so far
    for s, p in zip(group, params):
        alone = Engine(model, num_blocks=64).generate([prompt], [p])[0]
        assert (s.completion, s.logprobs) == (alone.completion, alone.logprobs)
