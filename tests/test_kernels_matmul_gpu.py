"""Linear on the GPU (Triton): reference, batch invariance under the pinned selection (its schedule
following M), the stock selection's split-K as negative control, and the fact the selection rests
on, re-measured on every linear site of the Qwen2 0.5B and 1.5B configs: a row's bits follow the K
partition alone — not M, not the tile, not parallel vs sequential chunks."""
from __future__ import annotations

import pytest
import torch

from detent_rl.kernels.matmul import linear, linear_ref
from detent_rl.kernels.programs.matmul import TILE_CHOICES
from test_kernels_matmul import _run, _selectors

pytestmark = pytest.mark.gpu

SHAPES = [(1152, 896, True), (9728, 896, False), (896, 4864, False), (151936, 896, False)]
# (n, k, bias): qkv, o, gate_up, down, LM head of Qwen2-0.5B, then of Qwen2-1.5B
SITES = [(1152, 896, True), (896, 896, False), (9728, 896, False), (896, 4864, False), (151936, 896, False),
         (2048, 1536, True), (1536, 1536, False), (17920, 1536, False), (1536, 8960, False), (151936, 1536, False)]
SCHEDULES = sorted({  # parallel, block_m, block_n, block_k, num_warps, num_stages: a grid, and every tile knob's choice
    (True, 16, 64, 128, 4, 4), (True, 16, 32, 128, 4, 4), (True, 32, 64, 64, 4, 4), (True, 64, 128, 64, 4, 3),
    (False, 16, 64, 128, 4, 4), (False, 64, 128, 64, 4, 3), (False, 128, 128, 32, 8, 3), (False, 128, 256, 64, 8, 3),
    *((t.parallel, t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages)
      for choices in TILE_CHOICES.values() for t in choices.values())})


def _data(n, k, bias, dtype, rows=2048):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g, device="cuda").to(dtype) if bias else None
    x = torch.randn(rows, k, generator=g, device="cuda").to(dtype)
    return x, w, b


def _failures(sel, x, w, b) -> list[str]:
    full = _run(x, w, b, sel(x.shape[0]))
    bad = []
    for m in (1, 2, 7, 16, 24, 32, 33, 64, 100, 512, 640, 1024):
        sub = _run(x[:m], w, b, sel(m))
        rows = (sub != full[:m]).any(dim=1).nonzero().flatten().tolist()
        if rows:
            bad.append(f"batch {m}: rows {rows[:5]} differ from batch {x.shape[0]}")
    perm = torch.randperm(x.shape[0], device="cuda")[:300]
    moved = _run(x[perm], w, b, sel(300))
    if not torch.equal(moved, full[perm]):
        bad.append("rows moved to other positions changed")
    return bad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k,bias", SHAPES)
def test_linear_gpu_reference_and_invariance(dtype, n, k, bias):
    if dtype == torch.float32 and n > 20000:
        pytest.skip("fp32 lm_head covered by bf16")
    x, w, b = _data(n, k, bias, dtype)
    stock, detent = _selectors(n, k, dtype.itemsize)  # fp32 operands: fp32 tiles' shared memory
    out = _run(x[:64], w, b, detent(64))
    ref = linear_ref(x[:64], w, b)
    rel = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1)).item()
    assert rel < (1e-4 if dtype == torch.float32 else 2e-2), rel
    assert _failures(detent, x, w, b) == []
    if stock(1).chunk != stock(x.shape[0]).chunk:  # the LM head's N fills the SMs unsplit: no control there
        assert _failures(stock, x, w, b), "negative control: stock split-K for small batches must change bits"


@pytest.mark.parametrize("n, k, bias", SITES, ids=[f"{k}to{n}" for n, k, _ in SITES])
def test_rows_follow_the_chunk_not_m_or_the_schedule(n, k, bias):
    rows = 256 if n > 100_000 else 2048
    x, w, b = _data(n, k, bias, torch.bfloat16, rows)
    for chunk in (128, 1 << 20):  # a split partition (one BLOCK_K 128 block per chunk too), and K in one piece
        full = linear(x, w, b, chunk=chunk, parallel=False, block_m=128, block_n=128, block_k=64, num_warps=8)
        bad = []
        for parallel, bm, bn, bk, warps, stages in SCHEDULES:
            for m in (1, 3, 16, 100, rows):
                got = linear(x[:m], w, b, chunk=chunk, parallel=parallel, block_m=bm, block_n=bn, block_k=bk,
                             num_warps=warps, num_stages=stages)
                rows_bad = (got != full[:m]).any(dim=1).nonzero().flatten().tolist()
                if rows_bad:
                    bad.append(f"chunk {chunk} {(parallel, bm, bn, bk, warps, stages)} M={m}: rows {rows_bad[:4]}")
        assert not bad, "rows changed with M or the schedule:\n" + "\n".join(bad)


@pytest.mark.parametrize("n, k, bias", SITES, ids=[f"{k}to{n}" for n, k, _ in SITES])
def test_decode_tiles_off_the_3d_grid_keep_the_bits(n, k, bias):
    """GROUP_M 1 (the decode buckets' tiles) reads a program's tile off a 3-D grid (`matmul._program_offsets`, no
    run-time division): the same tiles as the grouped order's, so the same rows, at every M the decode buckets
    serve and past them (several row tiles), for a cut and a whole K. The control is
    `test_another_chunk_rounds_differently`."""
    rows = 256 if n > 100_000 else 512
    x, w, b = _data(n, k, bias, torch.bfloat16, rows)
    bad = []
    for chunk in (128, 1 << 20):
        full = linear(x, w, b, chunk=chunk, parallel=False, block_m=128, block_n=128, block_k=64, num_warps=8)
        for parallel, bm, bn, bk in ((True, 16, 64, 128), (True, 16, 32, 128), (False, 16, 64, 128)):
            for m in (1, 7, 32, 100, rows):
                for group_m in (1, 8):
                    got = linear(x[:m], w, b, chunk=chunk, parallel=parallel, block_m=bm, block_n=bn, block_k=bk,
                                 group_m=group_m, num_warps=4, num_stages=4)
                    if not torch.equal(got, full[:m]):
                        bad.append(f"chunk {chunk} {(parallel, bm, bn, bk)} group {group_m} M={m}")
    assert not bad, "rows changed with the grid:\n" + "\n".join(bad)


def test_another_chunk_rounds_differently():
    changed = []
    for n, k, bias in SITES[:4]:
        x, w, b = _data(n, k, bias, torch.bfloat16, 64)
        a = linear(x, w, b, chunk=256, parallel=True, block_m=16, block_n=64, block_k=64)
        c = linear(x, w, b, chunk=128, parallel=True, block_m=16, block_n=64, block_k=64)
        changed.append(not torch.equal(a, c))
    assert any(changed), "a different K partition must change some site's bits, else the pin is vacuous"


@pytest.mark.parametrize("n, k, bias", SITES[:5], ids=[f"{k}to{n}" for n, k, _ in SITES[:5]])
def test_the_flat_sequential_loop_keeps_the_bits(n, k, bias):
    """`linear(flat=True)` (one loop over all K blocks, the chunk sum folded at chunk ends) against the
    per-chunk loops, at chunks of one, two and ten BLOCK_K blocks and in the large tiles it is for."""
    rows = 256 if n > 100_000 else 2048
    x, w, b = _data(n, k, bias, torch.bfloat16, rows)
    bad = []
    for chunk in (128, 640):
        ref = linear(x, w, b, chunk=chunk, parallel=False, block_m=128, block_n=128, block_k=64, num_warps=8)
        for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4),
                                          (128, 128, 128, 8, 3)):
            for m in (1, 100, rows):
                got = linear(x[:m], w, b, chunk=chunk, parallel=False, block_m=bm, block_n=bn, block_k=bk,
                             num_warps=warps, num_stages=stages, flat=True)
                if not torch.equal(got, ref[:m]):
                    bad.append(f"chunk {chunk} {(bm, bn, bk, warps, stages)} M={m}")
    assert not bad, "the flat loop changed rows:\n" + "\n".join(bad)


@pytest.mark.parametrize("n, k, bias", SITES, ids=[f"{k}to{n}" for n, k, _ in SITES])
def test_wgmma_sequential_form_keeps_the_bits(n, k, bias):
    """`linear(wgmma=True)` (`matmul_wgmma`: warpgroup MMAs issued by hand, waited for once a chunk)
    against the Triton kernel's rows of the same partition, at ragged M, tiles (64 and 128 rows, 64-256
    columns; swapped, x's 16-64 rows in the MMA's N slot), ring depths and BLOCK_K, one tile a program or
    persistent (a program's tiles in turn, the ring running on across them); control: the partition still
    decides the bits (K whole differs from 128-element chunks)."""
    from detent_rl.kernels.matmul_wgmma import applies, tile_fits
    from detent_rl.kernels.matmul_wgmma_plan import linear_wgmma
    rows = 256 if n > 100_000 else 2048
    x, w, b = _data(n, k, bias, torch.bfloat16, rows)
    if not applies(x, w, 64):
        pytest.skip("warpgroup MMAs need an sm_90 GPU and Triton's Gluon")
    bad, outs = [], {}
    for chunk in (128, 640, 1 << 20):
        ref = linear(x, w, b, chunk=chunk, parallel=False, block_m=128, block_n=128, block_k=64, num_warps=8)
        for bm, bn, bk, ring, swap in ((128, 128, 64, 4, False), (128, 128, 128, 3, False), (64, 64, 64, 6, False),
                                        (64, 256, 64, 3, False), (128, 256, 64, 3, False), (32, 64, 64, 6, True),
                                        (16, 128, 64, 4, True), (64, 64, 64, 6, True), (64, 128, 64, 4, False)):
            if chunk % bk or not tile_fits(bm, bn, chunk < k, swap):
                continue
            for m in (1, 77, 300, rows) if not swap else (1, 5, 32, 77, 300):
                # one tile a program; persistent, as many programs as the SMs hold; persistent, 7 programs
                for persistent, programs in ((False, 0), (True, 0), (True, 7)):
                    got = linear_wgmma(x[:m], w, b, chunk=chunk, block_k=bk, num_buffers=ring, block_m=bm,
                                       block_n=bn, swap_ab=swap, persistent=persistent, programs=programs)
                    if not torch.equal(got, ref[:m]):
                        bad.append(f"chunk {chunk} ({bm}x{bn}, bk {bk}, ring {ring}, swap {swap}, persistent "
                                   f"{persistent} {programs}) M={m}: {int((got != ref[:m]).sum())} outputs differ")
        via = linear(x[:300], w, b, chunk=chunk, parallel=False, block_m=128, block_n=128, block_k=64,
                     num_stages=4, wgmma=True)
        if not torch.equal(via, ref[:300]):
            bad.append(f"chunk {chunk}: linear(wgmma=True) differs")
        outs[chunk] = ref
    assert not bad, "the warpgroup-MMA kernel changed rows:\n" + "\n".join(bad)
    assert not torch.equal(outs[128], outs[1 << 20]), "control: another partition must round differently"


@pytest.mark.parametrize("n, k, bias", SITES[:4] + SITES[8:9], ids=[f"{k}to{n}" for n, k, _ in SITES[:4] + SITES[8:9]])
def test_wgmma_parallel_form_keeps_the_bits(n, k, bias):
    """`linear(parallel=True, wgmma=True)` where K is cut: each (tile, chunk) a program of the warpgroup
    kernel (`split`), its fp32 sum stored by TMA to a workspace whose chunk slices are whole tiles tall, the
    sums then added in chunk order (`combine_splits`). Rows equal the Triton kernel's of the same partition
    at ragged M, for tiles of 64 and 128 rows, one unit a program or persistent (7 programs: each several
    units, chunks of several tiles); control: another partition rounds differently."""
    from detent_rl.kernels.matmul_wgmma import applies
    from detent_rl.kernels.matmul_wgmma_plan import linear_wgmma
    x, w, b = _data(n, k, bias, torch.bfloat16, 1000)
    if not applies(x, w, 64):
        pytest.skip("warpgroup MMAs need an sm_90 GPU and Triton's Gluon")
    bad, outs = [], {}
    for chunk in (128, 640):
        ref = linear(x, w, b, chunk=chunk, parallel=True, block_m=16, block_n=64, block_k=64)
        for bm, bn, ring in ((64, 64, 4), (64, 128, 4), (128, 128, 3), (128, 256, 3)):
            for m in (1, 77, 300, x.shape[0]):
                for persistent, programs in ((False, 0), (True, 0), (True, 7)):
                    got = linear_wgmma(x[:m], w, b, chunk=chunk, block_k=64, num_buffers=ring, block_m=bm,
                                       block_n=bn, persistent=persistent, programs=programs, split=True)
                    if not torch.equal(got, ref[:m]):
                        bad.append(f"chunk {chunk} ({bm}x{bn}, ring {ring}, persistent {persistent} {programs}) "
                                   f"M={m}: {int((got != ref[:m]).sum())} outputs differ")
        via = linear(x[:77], w, b, chunk=chunk, parallel=True, block_m=64, block_n=128, block_k=64, wgmma=True)
        if not torch.equal(via, ref[:77]):
            bad.append(f"chunk {chunk}: linear(parallel=True, wgmma=True) differs")
        outs[chunk] = ref
    assert not bad, "the warpgroup kernel's parallel form changed rows:\n" + "\n".join(bad)
    assert not torch.equal(outs[128], outs[640]), "control: another partition must round differently"


@pytest.mark.parametrize("n, k", [(896, 4864), (1536, 1536), (1536, 8960)], ids=["down05", "o15", "down15"])
def test_rank_partials_folded_in_order_are_the_one_gpu_linear(n, k):
    """TP-invariant mode's row-parallel sum (models/parallel.py): K cut in two; each half's unrounded fp32
    sum (`out_dtype=torch.float32`, one chunk) added in order, then the bias, then one rounding, equals
    the one-GPU linear whose chunk is K / 2, in both schedules. (1.5B's down at K / 2 = 4,480.)"""
    x, w, b = _data(n, k, True, torch.bfloat16, 512)
    half = k // 2
    for parallel, bm, bn in ((True, 16, 64), (False, 128, 128)):
        one = linear(x, w, b, chunk=half, parallel=parallel, block_m=bm, block_n=bn, block_k=64)
        parts = [linear(x[:, r * half:(r + 1) * half].contiguous(), w[:, r * half:(r + 1) * half].contiguous(),
                        None, chunk=half, parallel=parallel, block_m=bm, block_n=bn, block_k=64,
                        out_dtype=torch.float32) for r in range(2)]
        assert parts[0].dtype == torch.float32
        folded = ((parts[0] + parts[1]) + b.float()).to(torch.bfloat16)
        assert torch.equal(folded, one), (parallel, (folded != one).sum().item())


# (n, k, bias, linear_wgmma's schedule): K whole, K cut (sequential), swapped, the parallel form, persistent
REPLAYED = [(1152, 896, True, dict(chunk=896, block_m=64, block_n=64)),
            (896, 4864, False, dict(chunk=640, block_m=128, block_n=128)),
            (1536, 1536, False, dict(chunk=1536, block_m=32, block_n=128, swap_ab=True)),
            (896, 4864, True, dict(chunk=640, block_m=128, block_n=128, split=True, persistent=True)),
            (9728, 896, False, dict(chunk=896, block_m=64, block_n=128, persistent=True))]


@pytest.mark.parametrize("n, k, bias, form", REPLAYED, ids=["whole", "cut", "swap", "split", "persistent"])
def test_wgmma_replayed_launch_is_tritons_own(n, k, bias, form, monkeypatch):
    """`linear_wgmma` plans a call shape once and replays later calls straight into Triton's launcher (the
    weights' TMA descriptors encoded once): every output equals Triton's own launch path's (DETENT_LAUNCH=triton)
    bit for bit, for new activations, another weight of the same shape, and inside a CUDA graph. Control: a
    weight descriptor left stale (another weight's address) is seen."""
    from detent_rl.kernels import matmul_wgmma as MW
    from detent_rl.kernels.matmul_wgmma_plan import linear_wgmma

    if not MW.HAS_GLUON or not MW._is_sm90(torch.device("cuda")):
        pytest.skip("the warpgroup kernel runs on sm_90")
    x, w, b = _data(n, k, bias, torch.bfloat16, 300)
    w2 = torch.roll(w, 1, 0).contiguous()  # same shape, another address
    from detent_rl.kernels import launch as _launch

    replays = []
    real = _launch.Recorded.__call__
    monkeypatch.setattr(_launch.Recorded, "__call__", lambda self, *a, **k: replays.append(real(self, *a, **k))
                        or replays[-1])

    def run(xx, ww):
        return linear_wgmma(xx, ww, b, **form)

    with monkeypatch.context() as m:
        m.setenv("DETENT_LAUNCH", "triton")
        own = {i: run(x[:m_], ww) for i, (m_, ww) in enumerate(((300, w), (37, w), (300, w2)))}
    assert not any(replays), "Triton's own path was asked for: nothing replayed"
    replays.clear()
    for _ in range(2):  # the first call of a shape records (under Triton's own launch); later ones replay
        got = {i: run(x[:m_].clone(), ww) for i, (m_, ww) in enumerate(((300, w), (37, w), (300, w2)))}
        for i in own:
            assert torch.equal(got[i], own[i]), f"case {i}: {(got[i] != own[i]).sum().item()} outputs differ"
    assert replays.count(True) >= (6 if form.get("split") else 3), f"replayed {replays}"  # (split: its combine too)
    # inside a captured graph: new data in the static input is read at replay
    static = x[:37].clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(static, w)
    static.copy_(x[100:137])
    graph.replay()
    torch.cuda.synchronize()
    with monkeypatch.context() as m:
        m.setenv("DETENT_LAUNCH", "triton")
        assert torch.equal(captured, run(x[100:137], w))
    # control: w2's descriptor pointed at w's memory must show
    for key in list(_launch._TMA_MAPS):
        if key[0] == w2.data_ptr():
            _launch._TMA_MAPS[key] = _launch._TMA_MAPS[(w.data_ptr(),) + key[1:]]
    stale = run(x[:300], w2)
    _launch._TMA_MAPS.clear()
    assert torch.equal(stale, own[0]) and not torch.equal(stale, own[2]), "control: a stale descriptor must show"


def test_linear_route_skips_only_what_its_key_fixes(monkeypatch):
    """`linear` keeps a warpgroup call's plan under its key (`_ROUTES`): a repeat of the call goes straight to the
    plan (no operand checks) with bits equal to the Triton kernel's at the same partition, for new data and another
    weight of the same shape; a call differing in anything the checks read takes the checked path again (an x
    misaligned for TMA: the Triton kernel; rows twice as far apart: a plan of their own; a bias of another dtype:
    the operand check's error), as does a change of DETENT_PDL. Control: with the route's key made blind to x's row
    stride, the strided call is sent to the contiguous call's plan, whose descriptor reads the wrong rows."""
    from detent_rl.kernels import matmul as MM
    from detent_rl.kernels import matmul_wgmma as MW

    if not MW.HAS_GLUON or not MW._is_sm90(torch.device("cuda")):
        pytest.skip("the warpgroup kernel runs on sm_90")
    n, k = 1152, 896
    x, w, b = _data(n, k, True, torch.bfloat16, 300)
    w2 = torch.roll(w, 1, 0).contiguous()
    p = dict(chunk=896, parallel=False, block_m=64, block_n=64, block_k=64, num_stages=4, wgmma=True)
    checked = []
    real_check = MM.check_operands
    monkeypatch.setattr(MM, "check_operands", lambda *a: checked.append(1) or real_check(*a))
    MM._ROUTES.clear()
    want = {i: linear(xx, ww, b, **dict(p, wgmma=False)) for i, (xx, ww) in enumerate(((x, w), (x.flip(0), w),
                                                                                      (x, w2)))}
    checked.clear()
    for i, (xx, ww) in enumerate(((x, w), (x.flip(0).contiguous(), w), (x, w2), (x, w))):
        assert torch.equal(linear(xx, ww, b, **p), want[i % 3]), i
    assert len(checked) == 1, f"checks ran {len(checked)} times: only the first call's should"
    # an x the TMA cannot read (2-byte aligned): the checked path, the Triton kernel
    flat = torch.empty(300 * k + 1, dtype=x.dtype, device="cuda")
    odd = flat[1:].view(300, k)
    odd.copy_(x)
    checked.clear()
    assert torch.equal(linear(odd, w, b, **p), want[0]) and len(checked) == 1
    with pytest.raises(AssertionError):
        linear(x, w, b.float(), **p)
    monkeypatch.setenv("DETENT_PDL", "0")
    checked.clear()
    assert torch.equal(linear(x, w, b, **p), want[0]) and len(checked) == 1
    # rows twice as far apart: their own plan (another descriptor), the same bits
    wide = torch.empty(300, 2 * k, dtype=x.dtype, device="cuda")
    strided = wide[:, :k]
    strided.copy_(x)
    assert torch.equal(linear(strided, w, b, **p), want[0])
    # control: a key blind to x's row stride sends the strided x to the contiguous call's plan
    monkeypatch.delenv("DETENT_PDL")
    linear(x, w, b, **p)
    dense = next(r for r in MM._ROUTES if r[0] == x.shape and r[1] == (k, 1) and r[5] == w.shape and r[-1] == "1")
    MM._ROUTES[dense[:1] + ((2 * k, 1),) + dense[2:]] = MM._ROUTES[dense]
    wide.copy_(torch.randn_like(wide))
    strided.copy_(x)
    wrong = linear(strided, w, b, **p)
    MM._ROUTES.clear()
    assert not torch.equal(wrong, want[0]), "control: a route blind to the row stride must show"
