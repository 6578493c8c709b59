"""Attention on the GPU (Triton): reference, and every way a request's rows can be computed —
trainer prefill, prefill + decode, chunked prefill, mixed batch, prefix hit — equal bit for bit
under the pinned selection; the stock selection visibly differs."""
from __future__ import annotations

import pytest
import torch

from attention_cases import FACTS, Requests, mismatches, scenario_outputs, selections
from detent_rl.kernels.attention import attention_ref

pytestmark = pytest.mark.gpu

QWEN2_05B = {**FACTS, "num_heads": 14, "num_kv_heads": 2, "head_dim": 64, "max_context": 4096,
             "max_batch": 256, "max_num_tokens": 8192}
LLAMA_8B = {**FACTS, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "max_context": 4096,
            "max_batch": 256, "max_num_tokens": 8192}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_gpu_matches_reference(dtype):
    _, detent = selections(QWEN2_05B, split_size=512)
    reqs = Requests([1500, 333, 1], QWEN2_05B, dtype, "cuda")
    outs = reqs.step([(0, 0, 1500), (1, 0, 333), (2, 0, 1)], detent)
    for r, out in enumerate(outs):
        ref = attention_ref(reqs.q[r], reqs.k[r], reqs.v[r], 0, reqs.scale)
        err = (out.float() - ref.float()).abs().max().item()
        assert err < (2e-5 if dtype == torch.float32 else 3e-2), (r, err)


@pytest.mark.parametrize("facts", [QWEN2_05B, LLAMA_8B], ids=["qwen2-0.5b", "llama-8b"])
@pytest.mark.parametrize("split_size", [256, 1024, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pinned_attention_gpu_is_invariant(facts, split_size, dtype):
    _, detent = selections(facts, split_size=split_size)
    reqs = Requests([2100, 700, 9, 1300, 64], facts, dtype, "cuda", seed=3)
    failures = mismatches(scenario_outputs(reqs, 0, detent, seed=4))
    failures += mismatches(scenario_outputs(reqs, 3, detent, seed=5))
    assert failures == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_stock_attention_gpu_is_not(dtype):
    stock, _ = selections(QWEN2_05B)
    reqs = Requests([2100, 700, 9, 1300, 64], QWEN2_05B, dtype, "cuda", seed=3)
    assert mismatches(scenario_outputs(reqs, 0, stock, seed=4)), \
        "negative control: the stock arm's tiles and split count follow the batch"


@pytest.mark.parametrize("facts", [QWEN2_05B, LLAMA_8B], ids=["qwen2-0.5b", "llama-8b"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_packed_tiles_keep_bits(facts, dtype):
    """Packing a GQA group into a tile's rows is a schedule: every scenario's rows, packed, equal the
    unpacked one-shot prefill bit for bit (so decode may pack while a trainer's prefill does not).
    Control: the same comparison sees a change of KV tile (block_n 32), which regroups the keys."""
    _, detent = selections(facts, split_size=1024)
    reqs = Requests([2100, 700, 9, 1300, 64], facts, dtype, "cuda", seed=3)
    reqs.pack = 1
    ref = scenario_outputs(reqs, 0, detent, seed=4)["prefill"]
    reqs.pack = facts["num_heads"] // facts["num_kv_heads"]
    packed = scenario_outputs(reqs, 0, detent, seed=4)
    assert mismatches({"prefill": ref, **{f"packed {k}": v for k, v in packed.items()}}) == []
    narrow = lambda *a: detent(*a)._replace(block_n=32)  # noqa: E731
    control = scenario_outputs(reqs, 0, narrow, seed=4)["prefill"]
    assert not torch.equal(control, ref), "control: another KV tile must change the bits"


@pytest.mark.parametrize("facts", [QWEN2_05B, LLAMA_8B], ids=["qwen2-0.5b", "llama-8b"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefetch_keeps_bits(facts, dtype):
    """The KV prefetch (each block's pages and keys loaded one iteration ahead) is a schedule: every
    scenario's rows, prefetched and packed as decode runs them, equal the plain loop's one-shot
    prefill bit for bit. Control: a change of KV tile (block_n 32) is seen by the same comparison."""
    _, detent = selections(facts, split_size=1024)
    reqs = Requests([2100, 700, 9, 1300, 64], facts, dtype, "cuda", seed=3)
    reqs.pack, reqs.prefetch = 1, False
    ref = scenario_outputs(reqs, 0, detent, seed=4)["prefill"]
    reqs.prefetch = True
    for pack in (1, facts["num_heads"] // facts["num_kv_heads"]):
        reqs.pack = pack
        out = scenario_outputs(reqs, 0, detent, seed=4)
        assert mismatches({"prefill": ref, **{f"prefetch, pack {pack}, {k}": v for k, v in out.items()}}) == []
    narrow = lambda *a: detent(*a)._replace(block_n=32)  # noqa: E731
    control = scenario_outputs(reqs, 0, narrow, seed=4)["prefill"]
    assert not torch.equal(control, ref), "control: another KV tile must change the bits"


@pytest.mark.parametrize("facts", [QWEN2_05B, LLAMA_8B], ids=["qwen2-0.5b", "llama-8b"])
@pytest.mark.parametrize("split_size", [256, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fixed_split_keeps_bits(facts, split_size, dtype):
    """The split size compiled in (`paged_attention(fixed_split=True)`, how the pinned arms run) is a schedule:
    every scenario's rows and log-sum-exps equal those of the run-time split size's one-shot prefill, bit for
    bit. Control: a change of KV tile (block_n 32) is seen by the same comparison."""
    _, detent = selections(facts, split_size=split_size)
    reqs = Requests([2100, 700, 9, 1300, 64], facts, dtype, "cuda", seed=3)
    ref = scenario_outputs(reqs, 0, detent, seed=4)["prefill"]
    reqs.fixed_split = True
    fixed = scenario_outputs(reqs, 0, detent, seed=4)
    assert mismatches({"prefill": ref, **{f"fixed {k}": v for k, v in fixed.items()}}) == []
    reqs.keep_lse = True
    lse = {}
    for fixed_split in (False, True):
        reqs.fixed_split = fixed_split
        reqs.step([(0, 0, 2100), (2, 0, 9)], detent)
        lse[fixed_split] = reqs.lse
    assert torch.equal(lse[False], lse[True]), "the log-sum-exps of the two split arguments differ"
    narrow = lambda *a: detent(*a)._replace(block_n=32)  # noqa: E731
    control = scenario_outputs(reqs, 0, narrow, seed=4)["prefill"]
    assert not torch.equal(control, ref), "control: another KV tile must change the bits"


@pytest.mark.parametrize("facts", [QWEN2_05B, LLAMA_8B], ids=["qwen2-0.5b", "llama-8b"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_split_writes_the_combines_bits(facts, dtype):
    """With one split the attention kernel can write its rows and log-sum-exp itself: every scenario's
    rows and the one-shot prefill's log-sum-exp equal those the combine kernel writes from the same
    split, bit for bit, packed and not, in 64-row tiles and in the 16-row decode tile. Control: a
    change of KV tile (block_n 32) is seen by the comparison."""
    _, pinned = selections(facts, split_size=facts["max_context"])
    assert pinned(1, 1, 1, 1).num_splits == 1
    reqs = Requests([2100, 700, 9, 1300, 64], facts, dtype, "cuda", seed=3)
    for pack, block_m in ((1, 64), (facts["num_heads"] // facts["num_kv_heads"], 64), (1, 16)):
        detent = lambda *a, block_m=block_m: pinned(*a)._replace(block_m=block_m)  # noqa: E731
        reqs.pack, out, lse = pack, {}, {}
        for combine in (True, False):
            reqs.combine, reqs.keep_lse = combine, True
            lse[combine] = (reqs.step([(0, 0, 2100), (2, 0, 9)], detent), reqs.lse)
            reqs.keep_lse = False
            out[combine] = scenario_outputs(reqs, 0, detent, seed=4)
        assert torch.equal(lse[True][1], lse[False][1]), f"pack {pack}, block_m {block_m}: log-sum-exp"
        for a, b in zip(lse[True][0], lse[False][0]):
            assert torch.equal(a, b), f"pack {pack}, block_m {block_m}: rows of the log-sum-exp step"
        assert mismatches({"prefill": out[True]["prefill"],
                           **{f"pack {pack}, block_m {block_m}, one kernel, {k}": v for k, v in out[False].items()}
                           }) == []
    narrow = lambda *a: detent(*a)._replace(block_n=32)  # noqa: E731
    control = scenario_outputs(reqs, 0, narrow, seed=4)["prefill"]
    assert not torch.equal(control, out[False]["prefill"]), "control: another KV tile must change the bits"


@pytest.mark.parametrize("facts", [QWEN2_05B, LLAMA_8B], ids=["qwen2-0.5b", "llama-8b"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_query_tile_is_a_schedule(facts, dtype):
    """A row's bits do not see its query tile's height: every scenario's rows in 16-, 32- and 128-row
    tiles (mma.sync at 16 and 32 rows, warpgroup MMAs at 64 and 128, 4 or 8 warps), packed and not,
    split and with one split, equal the 64-row one-shot prefill's, because the row's softmax sum is a
    dot. Control: the kernel's former row sum (`tl.sum`, a tree the tile's layout shapes) sees the
    change of tile in the same comparison."""
    group = facts["num_heads"] // facts["num_kv_heads"]
    reqs = Requests([2100, 700, 9, 1300, 64], facts, dtype, "cuda", seed=3)
    for split_size in (1024, facts["max_context"]):
        _, pinned = selections(facts, split_size=split_size)
        tile = lambda bm, *a: pinned(*a)._replace(block_m=bm, num_warps=8 if bm >= 128 else 4)  # noqa: E731
        reqs.pack = 1
        ref = scenario_outputs(reqs, 0, lambda *a: tile(64, *a), seed=4)["prefill"]
        got = {}
        tiles = ((16, 1), (16, group), (32, 1), (32, group), (64, group)) + ((128, 1),) * (dtype != torch.float32)
        for bm, pack in tiles:  # (fp32's IEEE dot is FMAs in k order in any tile; 128 rows of them compile slowly)
            reqs.pack = pack
            out = scenario_outputs(reqs, 0, lambda *a, bm=bm: tile(bm, *a), seed=4)
            got.update({f"split {split_size}, {bm} rows, pack {pack}, {k}": v for k, v in out.items()})
        assert mismatches({"prefill": ref, **got}) == []
    reqs.pack, reqs.tree_sum = 1, True
    tree = {bm: scenario_outputs(reqs, 0, lambda *a, bm=bm: tile(bm, *a), seed=4) for bm in (16, 64)}
    assert mismatches({"prefill": tree[64]["prefill"], **{f"16 rows, {k}": v for k, v in tree[16].items()}}), \
        "control: a tl.sum row sum must change some row's bits with the tile's height"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_combine_unrolled_keeps_the_plain_loops_bits(dtype):
    """The combine kernel's loops load four splits a trip: its outputs and log-sum-exps equal the plain
    loop's (one split's loads, then its sums) bit for bit, rows of 1-9 splits. Control: the plain loop given
    each row's splits in reverse order differs in the same comparison (`tests/combine_cases.py`)."""
    from combine_cases import check_combine
    assert check_combine("cuda", dtype) == []
