"""Attention on the CPU: reference, and prefill == prefill+decode == chunked == mixed batch ==
prefix hit, bit for bit, under the pinned selection; the stock selection visibly differs."""
from __future__ import annotations

import pytest
import torch

from attention_cases import FACTS, Requests, mismatches, scenario_outputs, selections
from detent_rl.kernels.attention import attention_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_matches_reference(dtype):
    _, detent = selections()
    reqs = Requests([300, 37, 5], FACTS, dtype, "cpu")
    outs = reqs.step([(0, 0, 300), (1, 0, 37), (2, 0, 5)], detent)
    for r, out in enumerate(outs):
        ref = attention_ref(reqs.q[r], reqs.k[r], reqs.v[r], 0, reqs.scale)
        err = (out.float() - ref.float()).abs().max().item()
        assert err < (1e-5 if dtype == torch.float32 else 3e-2), (r, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pinned_attention_is_invariant_and_stock_is_not(dtype):
    stock, detent = selections()
    reqs = Requests([290, 60, 7, 130], FACTS, dtype, "cpu", seed=1)
    assert mismatches(scenario_outputs(reqs, 0, detent, seed=2)) == []
    failures = mismatches(scenario_outputs(reqs, 0, stock, seed=2))
    assert failures, "negative control: stock tiles/splits follow the batch and must change bits"


def test_packed_tiles_interpreted():
    """The Triton kernel's packed rows (a tile = queries x the heads of one GQA group) address the
    same queries, heads and outputs as the unpacked ones, with and without the KV prefetch (pages and
    keys loaded one block ahead): under the CPU interpreter all equal the reference, on prefill,
    chunked and decode steps whose keys cross pages and splits (logic only; the GPU tests compare bits).
    The log-sum-exp the combine writes for the trainer's backward equals each row's, split or not; with one
    split the attention kernel writes the rows and log-sum-exp the combine would, and a row's heads combined in
    one program (`_combine_heads_kernel`, padded heads) the ones a program per (row, head) writes."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
from attention_cases import FACTS, Requests, selections
import detent_rl.kernels.attention_combine as combiner
from detent_rl.kernels.attention import attention_ref
heads_from = combiner.COMBINE_HEADS_FROM
facts = {**FACTS, "num_heads": 6, "num_kv_heads": 2, "head_dim": 16}
_, detent = selections(facts)
small = lambda *a: detent(*a)._replace(block_m=16, block_n=16, split_size=32, num_splits=16, num_stages=1)
reqs = Requests([36, 3, 1], facts, torch.float32, "cpu", seed=2)
for pack, prefetch in ((1, True), (3, True), (3, False)):
    reqs.pack, reqs.prefetch, reqs.keep_lse = pack, prefetch, True
    outs = reqs.step([(0, 0, 36), (1, 0, 3), (2, 0, 1)], small)
    lse = reqs.lse.clone()
    combiner.COMBINE_HEADS_FROM = 0  # every combine one program a row (6 heads padded to 8): the same bits
    rows = reqs.step([(0, 0, 36), (1, 0, 3), (2, 0, 1)], small)
    combiner.COMBINE_HEADS_FROM = heads_from
    assert torch.equal(reqs.lse, lse) and all(map(torch.equal, rows, outs)), ("a row's heads in one program", pack)
    at = 0
    for r, n in ((0, 36), (1, 3), (2, 1)):  # each row's log-sum-exp of its scaled causal scores
        rep = reqs.q[r].shape[1] // reqs.k[r].shape[1]
        s = torch.einsum("qhd,khd->hqk", reqs.q[r], reqs.k[r].repeat_interleave(rep, 1)) * reqs.scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        err = (reqs.lse[:, at:at + n] - torch.logsumexp(s, -1)).abs().max().item()
        assert err < 1e-5, ("lse", pack, r, err)
        at += n
    one = lambda *a: small(*a)._replace(split_size=64, num_splits=1)  # the kernel writes rows and lse itself
    got = {}
    for combine in (True, False):
        reqs.combine = combine
        got[combine] = (reqs.step([(0, 0, 36), (1, 0, 3), (2, 0, 1)], one), reqs.lse)
    reqs.combine = None
    assert torch.equal(got[True][1], got[False][1]), ("one split: lse", pack)
    assert all(torch.equal(a, b) for a, b in zip(got[True][0], got[False][0])), ("one split", pack)
    outs += got[False][0]
    reqs.keep_lse = False
    outs += [torch.cat([reqs.step([(0, 0, 17)], small)[0], reqs.step([(0, 17, 19)], small)[0]])]
    outs += [torch.cat([reqs.step([(1, 0, 2)], small)[0], reqs.step([(1, 2, 1)], small)[0]])]
    for out, r in zip(outs, (0, 1, 2, 0, 1, 2, 0, 1)):
        ref = attention_ref(reqs.q[r], reqs.k[r], reqs.v[r], 0, reqs.scale)
        err = (out - ref).abs().max().item()
        assert err < 1e-5, (pack, prefetch, r, err)
print("packed ok")
""")
    assert proc.returncode == 0 and "packed ok" in proc.stdout, proc.stderr[-3000:]


def test_combine_unrolled_keeps_the_plain_loops_bits_interpreted():
    """The combine's loops, four splits a trip, fold the splits as the plain loop did: the same outputs and
    log-sum-exps for rows of 1-9 splits, fp32 and bf16 (logic; the GPU test compares bits). Control: the
    plain loop given each row's splits in reverse order differs in the same comparison (`tests/combine_cases.py`)."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
from combine_cases import check_combine
bad = check_combine("cpu", torch.float32) + check_combine("cpu", torch.bfloat16)
assert bad == [], bad
print("combine ok")
""")
    assert proc.returncode == 0 and "combine ok" in proc.stdout, proc.stderr[-3000:]


def test_prefetch_reads_the_same_keys_interpreted():
    """The prefetched loop (each block's pages and keys loaded one iteration ahead) folds the same keys
    in the same order as the plain loop: under the interpreter every row of every scenario is equal,
    and a prefetch that read one block late would not be. Control: a narrower KV tile differs."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
from attention_cases import FACTS, Requests, selections
facts = {**FACTS, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
_, detent = selections(facts)
small = lambda *a: detent(*a)._replace(block_m=16, block_n=16, split_size=48, num_splits=16, num_stages=1)
narrow = lambda *a: small(*a)._replace(block_n=8, split_size=48)
reqs = Requests([70, 5], facts, torch.float32, "cpu", seed=3)
outs = {}
for prefetch in (False, True):
    reqs.prefetch = prefetch
    outs[prefetch] = [reqs.step([(0, 0, 70), (1, 0, 5)], small), reqs.step([(0, 40, 30)], small),
                      reqs.step([(0, 69, 1)], small)]
for a, b in zip(outs[False], outs[True]):
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()
control = reqs.step([(0, 0, 70), (1, 0, 5)], narrow)[0]
assert not torch.equal(control, outs[True][0][0]), "control: another KV tile must change the bits"
print("prefetch ok")
""")
    assert proc.returncode == 0 and "prefetch ok" in proc.stdout, proc.stderr[-3000:]


def test_fixed_split_reads_the_same_splits_interpreted():
    """The split size compiled in (`fixed_split`, as the pinned arms run) cuts the same splits as the run-time
    argument: under the interpreter every row and log-sum-exp of prefill, chunked prefill and decode is equal
    (the combine's split count too: these rows span two and more splits). Control: a narrower KV tile differs."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
from attention_cases import FACTS, Requests, selections
facts = {**FACTS, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
_, detent = selections(facts)
small = lambda *a: detent(*a)._replace(block_m=16, block_n=16, split_size=32, num_splits=16, num_stages=1)
narrow = lambda *a: small(*a)._replace(block_n=8)
reqs = Requests([70, 5], facts, torch.float32, "cpu", seed=3)
reqs.keep_lse = True
outs = {}
for fixed in (False, True):
    reqs.fixed_split = fixed
    outs[fixed] = []
    for spans in ([(0, 0, 70), (1, 0, 5)], [(0, 40, 30)], [(0, 69, 1), (1, 4, 1)]):
        outs[fixed] += [*reqs.step(spans, small), reqs.lse]
for x, y in zip(outs[False], outs[True]):
    assert torch.equal(x, y), (x - y).abs().max()
control = reqs.step([(0, 0, 70), (1, 0, 5)], narrow)[0]
assert not torch.equal(control, outs[True][0]), "control: another KV tile must change the bits"
print("fixed split ok")
""")
    assert proc.returncode == 0 and "fixed split ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_tile_is_a_schedule_on_the_cpu(dtype):
    """The CPU path cuts every selection's tiles into CPU_ROWS queries (CPU matmuls read M): every scenario's
    rows under 16-, 64- and 128-row tiles, packed and not, equal the 64-row one-shot prefill's bit for bit.
    Control: the same comparison sees a change of KV tile (block_n 16), which regroups the keys."""
    _, detent = selections()
    reqs = Requests([290, 60, 7, 130], FACTS, dtype, "cpu", seed=1)
    tile = lambda bm, *a: detent(*a)._replace(block_m=bm)  # noqa: E731
    ref = scenario_outputs(reqs, 0, lambda *a: tile(64, *a), seed=2)["prefill"]
    got = {}
    for bm, pack in ((16, 1), (16, 2), (128, 1)):
        reqs.pack = pack
        out = scenario_outputs(reqs, 0, lambda *a, bm=bm: tile(bm, *a), seed=2)
        got.update({f"{bm} rows, pack {pack}, {k}": v for k, v in out.items()})
    assert mismatches({"prefill": ref, **got}) == []
    narrow = lambda *a: detent(*a)._replace(block_n=16)  # noqa: E731
    assert not torch.equal(scenario_outputs(reqs, 0, narrow, seed=2)["prefill"], ref), \
        "control: another KV tile must change the bits"


def test_query_tile_heights_interpreted():
    """The Triton kernel's 16- and 32-row tiles, packed and not, address the same rows and keys as its
    64-row prefill tile: under the interpreter (whose dot sums in k order, as an MMA's does on any tile)
    every scenario's rows are equal (logic only; the GPU test compares the MMA kinds' bits). Control: a
    narrower KV tile differs."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
from attention_cases import FACTS, Requests, mismatches, scenario_outputs, selections
facts = {**FACTS, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
_, detent = selections(facts)
tile = lambda bm, *a: detent(*a)._replace(block_m=bm, block_n=16, split_size=32, num_splits=16, num_stages=1)
reqs = Requests([21, 5], facts, torch.float32, "cpu", seed=3)
reqs.pack = 1
ref = scenario_outputs(reqs, 0, lambda *a: tile(64, *a), seed=4)["prefill"]
got = {}
for bm, pack in ((16, 2), (32, 1)):
    reqs.pack = pack
    out = scenario_outputs(reqs, 0, lambda *a, bm=bm: tile(bm, *a), seed=4)
    got.update({f"{bm} rows, pack {pack}, {k}": v for k, v in out.items()})
assert mismatches({"prefill": ref, **got}) == [], mismatches({"prefill": ref, **got})
narrow = lambda *a: tile(64, *a)._replace(block_n=8)
assert not torch.equal(scenario_outputs(reqs, 0, narrow, seed=4)["prefill"], ref), "control"
print("tiles ok")
""")
    assert proc.returncode == 0 and "tiles ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_out_takes_the_rows_into_a_larger_buffer(device):
    """`out=`: the output rows written into a view of a larger buffer (a step's graphed pieces read them there),
    bit-equal to a new output, for a prefill (split partials combined) and a decode step (on the GPU the kernel's
    own epilogue); a view that cannot hold q's rows is refused, naming what is wrong."""
    from detent_rl.kernels.attention import attn_meta, paged_attention
    _, detent = selections(split_size=512)  # one split: a 16-row decode tile writes its rows itself
    reqs = Requests([70, 9], FACTS, torch.float32, device, seed=3)
    width = len(reqs.tables[0])
    table = torch.tensor([t + [0] * (width - len(t)) for t in reqs.tables], dtype=torch.int32, device=device)
    for spans in ([(0, 0, 70), (1, 0, 9)], [(0, 69, 1), (1, 8, 1)]):
        q = torch.cat([reqs.q[r][p:p + n] for r, p, n in spans])
        T = q.shape[0]
        cfg = detent(2, max(n for _, _, n in spans), T, max(p + n for _, p, n in spans))
        meta = attn_meta([n for _, _, n in spans], [p for _, p, _ in spans], table, cfg.block_m)
        kw = dict(scale=reqs.scale, block_n=cfg.block_n, split_size=cfg.split_size, num_splits=cfg.num_splits)
        buffer = torch.full((T + 17, *q.shape[1:]), float("nan"), device=device)
        got = paged_attention(q, reqs.k_cache, reqs.v_cache, meta, out=buffer[:T], **kw)
        assert got.data_ptr() == buffer.data_ptr()
        assert torch.equal(buffer[:T], paged_attention(q, reqs.k_cache, reqs.v_cache, meta, **kw)), spans
        assert buffer[T:].isnan().all()  # nothing past the step's rows
    with pytest.raises(ValueError, match=r"attention out: \(1, 4, 32\)"):
        paged_attention(q, reqs.k_cache, reqs.v_cache, meta, out=buffer[:1], **kw)
