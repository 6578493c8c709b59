"""Linear on the CPU: matches the reference, a row's bits follow the K partition alone (not M, not
the schedule), batch-invariant under the pinned selection, and the stock selection (split-K for small
M) visibly is not; the Triton code under the CPU interpreter (logic only: GPU bits are
tests/test_kernels_matmul_gpu.py's)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from detent_rl.kernels.matmul import launch_params, linear, linear_ref
from detent_rl.kernels.programs.matmul import matmul_program
from detent_rl.kernels.selections import Deployment
from detent_rl.selir.solver import solve
from interpreted import run_interpreted

# Qwen2-0.5B-class projections: qkv (896 -> 1152, with bias) and down (4864 -> 896)
SHAPES = [(1152, 896, True), (896, 4864, False)]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


# the matmul facts of a Qwen2-0.5B-class deployment on an H200 (8,192 rows per step, bf16)
QWEN2_05B = Deployment(num_heads=14, num_kv_heads=2, head_dim=64, hidden=896, vocab=151936)


def _selectors(n: int, k: int, dtype_bytes: int = 2):
    """(stock, detent) selectors of the matmul site (n, k), for operands of `dtype_bytes` bytes."""
    deployment = dataclasses.replace(QWEN2_05B, dtype_bytes=dtype_bytes)
    sol = solve(matmul_program, deployment.facts("matmul", {"n": n, "k": k}))
    return sol.stock(), sol.commit()


def _run(x, w, b, cfg):
    return linear(x, w, b, **launch_params(cfg))


def _weights(n, k, bias, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,bias", SHAPES)
@pytest.mark.parametrize("chunk, parallel", [(128, True), (256, False), (8192, False)])
def test_linear_matches_reference(dtype, n, k, bias, chunk, parallel):
    w, b = _weights(n, k, bias, dtype)
    x = torch.randn(37, k).to(dtype)
    out = linear(x, w, b, chunk=chunk, parallel=parallel, block_m=16, block_n=64, block_k=64)
    ref = linear_ref(x, w, b)
    err = (out.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1.0)
    assert err <= TOL[dtype], err


def _invariance_failures(sel, dtype, n, k, bias) -> list[str]:
    w, b = _weights(n, k, bias, dtype)
    g = torch.Generator().manual_seed(1)
    batch = torch.randn(300, k, generator=g).to(dtype)
    full = _run(batch, w, b, sel(300))
    failures = []
    for m in (1, 3, 17, 64):
        sub = _run(batch[:m], w, b, sel(m))
        for i in range(m):
            if not torch.equal(sub[i], full[i]):
                diff = (sub[i].float() - full[i].float()).abs().max().item()
                failures.append(f"row {i} in a batch of {m} vs 300: max |d| {diff:.3g}")
    # the same row at another position
    moved = _run(torch.cat([batch[5:6], batch[:40]]), w, b, sel(41))
    if not torch.equal(moved[0], full[5]):
        failures.append("row 5 moved to position 0 changed")
    return failures


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,bias", SHAPES)
def test_pinned_partition_is_batch_invariant_and_stock_is_not(dtype, n, k, bias):
    stock, detent = _selectors(n, k)
    assert _invariance_failures(detent, dtype, n, k, bias) == []
    if stock(1).chunk == stock(300).chunk:  # K <= N: the stock selection never splits it
        assert k <= n
        return
    stock_failures = _invariance_failures(stock, dtype, n, k, bias)
    assert stock_failures, "negative control: the stock selection (split-K for decode) must change bits"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_follow_the_chunk_alone(dtype):
    w, b = _weights(96, 1000, True, dtype)
    x = torch.randn(130, 1000, generator=torch.Generator().manual_seed(2)).to(dtype)
    full = linear(x, w, b, chunk=64, parallel=False, block_m=32, block_n=64, block_k=32)
    bad = []
    for m in (1, 3, 17, 64, 129):
        for parallel, block_m in ((True, 16), (False, 64), (True, 128)):
            got = linear(x[:m], w, b, chunk=64, parallel=parallel, block_m=block_m, block_n=32, block_k=64)
            if not torch.equal(got, full[:m]):
                bad.append((m, parallel, block_m))
    assert not bad, f"rows changed with M or the schedule: {bad}"
    other = linear(x, w, b, chunk=32, parallel=False, block_m=32, block_n=64, block_k=32)
    assert not torch.equal(other, full), "another K partition must round differently (the control)"


def test_a_chunk_of_partial_blocks_is_refused():
    w, b = _weights(8, 64, True, torch.float32)
    with pytest.raises(AssertionError, match="whole BLOCK_K"):
        linear(torch.randn(2, 64), w, b, chunk=48, parallel=True, block_m=16, block_n=16, block_k=32)


def test_plain_cpu_fp32_matmul_reads_the_batch():
    # why the CPU path tiles: torch's fp32 CPU matmul gives a row other bits for other M
    w, _ = _weights(1152, 896, False, torch.float32)
    x = torch.randn(300, 896)
    full = x @ w.t()
    assert any(not torch.equal((x[i:i + 1] @ w.t())[0], full[i]) for i in range(0, 300, 7))


def test_triton_kernel_under_the_interpreter():
    # the tile stays fixed here, M and the schedule vary: the interpreter's tl.dot is a numpy matmul
    # per block, whose summation order follows the block's shape (the H200's tl.dot does not: the GPU
    # test measures that)
    code = r'''
import torch
from detent_rl.kernels.matmul import linear, linear_ref
torch.manual_seed(0)
bad = []
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(37, 200).to(dtype); w = torch.randn(72, 200).to(dtype); b = torch.randn(72).to(dtype)
    ref = linear(x, w, b, chunk=64, parallel=False, block_m=16, block_n=32, block_k=32)
    for chunk in (64, 256):
        out = linear(x, w, b, chunk=chunk, parallel=False, block_m=16, block_n=32, block_k=32)
        err = (out.float() - linear_ref(x, w, b).float()).abs().max().item()
        if err > (1e-3 if dtype == torch.float32 else 0.5):
            bad.append(("err", dtype, chunk, err))
    for m, parallel in ((1, True), (5, True), (37, True), (2, False)):
        got = linear(x[:m], w, b, chunk=64, parallel=parallel, block_m=16, block_n=32, block_k=32)
        if not torch.equal(got, ref[:m]):
            bad.append(("rows", dtype, m, parallel))
    # GROUP_M 1 reads its tile off a 3-D grid (row tile, chunk, column tile): the same tiles, so the same rows,
    # over several row and column tiles (M 37: three row tiles; N 72: three column tiles, the last partial)
    for m, parallel in ((1, True), (37, True), (37, False), (17, False)):
        got = linear(x[:m], w, b, chunk=64, parallel=parallel, block_m=16, block_n=32, block_k=32, group_m=1)
        if not torch.equal(got, ref[:m]):
            bad.append(("grid3 rows", dtype, m, parallel))
    for chunk in (64, 128):  # the flat loop folds at the same chunk ends (K = 200: a partial last chunk)
        seq = linear(x, w, b, chunk=chunk, parallel=False, block_m=16, block_n=32, block_k=32)
        if not torch.equal(linear(x, w, b, chunk=chunk, parallel=False, block_m=16, block_n=32, block_k=32,
                                  flat=True), seq):
            bad.append(("flat", dtype, chunk))
    # the parallel form's sums in a workspace whose chunk slices are taller than M (the warpgroup kernel's, whole
    # tiles): the first M rows of each slice added in order; the rows past M (huge here) must not leak in
    from detent_rl.kernels.matmul import combine_splits
    ws = torch.randn(3, 8, 72)
    ws[:, 5:] = 1e30
    got, tight = torch.empty(5, 72, dtype=dtype), torch.empty(5, 72, dtype=dtype)
    combine_splits(ws, b, got)
    combine_splits(ws[:, :5].contiguous(), b, tight)
    want = (((ws[0, :5] + ws[1, :5]) + ws[2, :5]) + b.float()).to(dtype)
    if not torch.equal(got, tight) or (dtype == torch.float32 and not torch.equal(got, want)):
        bad.append(("padded workspace", dtype))
    # a row wider than the reduce's 1,024-column program: three programs a row, the last partial
    ws = torch.randn(3, 2, 2100)
    wide_b = torch.randn(2100).to(dtype)
    got = torch.empty(2, 2100, dtype=dtype)
    combine_splits(ws, wide_b, got)
    if dtype == torch.float32 and not torch.equal(got, ((ws[0] + ws[1]) + ws[2]) + wide_b):
        bad.append(("wide rows", dtype))
print("BAD", bad)
'''
    out = run_interpreted(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BAD []" in out.stdout, out.stdout


def test_rank_partials_folded_in_order_are_the_one_gpu_linear_cpu():
    """The CPU path of tests/test_kernels_matmul_gpu.py's test of the same name (TP-invariant mode's sum)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 1024, generator=g).to(torch.bfloat16)
    w = (torch.randn(512, 1024, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(512, generator=g).to(torch.bfloat16)
    one = linear(x, w, b, chunk=512, parallel=False, block_m=16, block_n=64, block_k=64)
    parts = [linear(x[:, r * 512:(r + 1) * 512].contiguous(), w[:, r * 512:(r + 1) * 512].contiguous(), None,
                    chunk=512, parallel=False, block_m=16, block_n=64, block_k=64, out_dtype=torch.float32)
             for r in range(2)]
    assert torch.equal(((parts[0] + parts[1]) + b.float()).to(torch.bfloat16), one)
    assert not torch.equal((parts[0].to(torch.bfloat16) + parts[1].to(torch.bfloat16)) + b, one)  # rounded first


def test_the_schedule_follows_m_and_the_site_while_the_partition_stays():
    """The schedule rules of the matmul program (kernels/programs/matmul.py): K-whole calls of M 33-512
    take the 64 x 64 warpgroup tile (a ring of 4 once its tiles pass two an SM) but narrow outputs at
    M 33-64 (the Triton 16-row tile), wide outputs at M 17-32 the swapped warpgroup tile and at M 257-512
    the persistent 64 x 128 one; from M = 513 the persistent 128 x 256 tile while those tiles number half the
    SMs, else the persistent 128 x 128 one of 128-element K blocks, and to M = 2,048 the persistent 64 x 128
    tile on outputs 256-column tiles do not divide; the LM head the persistent 128 x 256 one from M = 65 and
    not when the schedule does not follow M; a cut K keeps its parallel Triton rows to M = 64, runs its
    parallel form in the warpgroup kernel at M 65-512 (64 x 64 tiles, then persistent 128 x 128 ones) and the
    warpgroup 128 x 128 tile (one a program, chunks in sequence) from M = 513. From M = 513 to 768, where those
    tiles leave SMs idle, a cut K runs its parallel form while its sequential tiles number under half the SMs, and
    K whole takes the 64 x 64 tiles while the bucket's tile numbers under the SMs; a cut K to M = 2,048 runs its
    chunks in sequence in the persistent 64 x 128 tiles while they fit one wave, unless its parallel form's units
    fit two; a tuned tile_2048 keeps its own. The pinned partition is one value for every M."""
    from detent_rl.kernels.programs.matmul import (DEEP_WGMMA_P, MID_WGMMA_P, ROWS16, SMALL_WGMMA,
                                                   SMALL_WGMMA_RING4, SPLIT_WGMMA_SMALL, SPLIT_WGMMA_WIDE,
                                                   SWAP_WGMMA, TILE_CHOICES, WGMMA_CHOICE, WIDE_WGMMA_P)

    def tile(sel, m):
        s = sel(m)
        return (s.tile_block_m, s.tile_block_n, s.tile_wgmma, s.tile_num_stages, s.tile_block_k, s.tile_persistent)

    def row(r):
        return (r.block_m, r.block_n, r.wgmma, r.num_stages, r.block_k, r.persistent)

    small, wide, deep_p, mid_p = row(SMALL_WGMMA), row(WIDE_WGMMA_P), row(DEEP_WGMMA_P), row(MID_WGMMA_P)
    ring4, rows16 = row(SMALL_WGMMA_RING4), row(ROWS16)
    _, qkv = _selectors(1152, 896)
    assert [tile(qkv, m)[2] for m in (1, 32)] == [False, False] and not any(qkv(m).tile_swap_ab for m in (17, 32))
    assert all(tile(qkv, m) == rows16 for m in (33, 64)), [tile(qkv, m) for m in (33, 64)]  # 18 tiles: Triton rows
    assert all(tile(qkv, m) == small for m in (65, 128, 300, 512)), [tile(qkv, m) for m in (65, 128, 300, 512)]
    assert tile(qkv, 513) == ring4 and tile(qkv, 768) == ring4  # 81 and 108 tiles of 64 x 128: under the SMs
    assert tile(qkv, 769) == mid_p and tile(qkv, 2048) == mid_p  # 1,152 columns: 4.5 tiles of 256
    assert tile(qkv, 2049) == wide and tile(qkv, 8192) == wide  # 85 and 320 tiles of 128 x 256
    _, qkv15 = _selectors(2048, 1536)
    # 40 and 48 tiles of 128 x 256 (under 66: 128 x 128 ones), 80 and 96 of those, under the 132 SMs: 64 x 64
    assert tile(qkv15, 513) == ring4 and tile(qkv15, 768) == ring4
    assert tile(qkv15, 769) == deep_p and tile(qkv15, 1024) == deep_p  # past FILL_M: the bucket's own
    assert tile(qkv15, 2048) == wide
    tuned = solve(matmul_program, QWEN2_05B.facts("matmul", {"n": 2048, "k": 1536})).commit(knobs={"tile_2048": 8})
    assert tile(tuned, 640) == deep_p  # a tuned tile_2048 keeps its choice
    _, gate_up = _selectors(9728, 896)
    assert not gate_up(16).tile_swap_ab and not gate_up(16).tile_wgmma  # M <= 16: the Triton 16-row tile
    assert all(gate_up(m).tile_swap_ab and tile(gate_up, m)[:3] == (SWAP_WGMMA.block_m, SWAP_WGMMA.block_n, True)
               for m in (17, 32))  # 152 column tiles, M 17-32: swapped
    assert tile(gate_up, 33) == small and tile(gate_up, 64) == small and not gate_up(64).tile_swap_ab
    assert tile(gate_up, 128) == ring4 != small  # 304 tiles: a ring of 4
    assert tile(gate_up, 256)[:3] == (64, 128, False)  # 608 tiles: the Triton 64 x 128 tile
    assert tile(gate_up, 257) == mid_p and tile(gate_up, 512) == mid_p and tile(gate_up, 2048) == wide
    assert not any(gate_up(m).tile_parallel for m in (1, 128, 512))  # K whole: nothing to run in parallel
    solution = solve(matmul_program, QWEN2_05B.facts("matmul", {"n": 151936, "k": 896}))
    head, head_one = solution.commit(), solution.commit(knobs={"schedule_by_m": False})
    assert [tile(head, m)[2] for m in (1, 64)] == [False, False]
    assert all(tile(head, m) == wide for m in (65, 256, 4096))
    assert not any(tile(head_one, m)[2] for m in (1, 65, 4096))  # one schedule for every M: the Triton one
    _, down = _selectors(896, 4864)
    cut = solve(matmul_program, QWEN2_05B.facts("matmul", {"n": 896, "k": 4864})).commit(pins={"chunk": 640})
    big = row(TILE_CHOICES[2048][WGMMA_CHOICE])
    # 63-126 tiles of 64 x 128 to M = 1,152, chunks in sequence (the parallel form's 280-360 units: past two waves)
    assert all(tile(cut, m) == mid_p and not cut(m).tile_parallel for m in (513, 768, 769, 1152))
    assert tile(cut, 1153) == big and tile(cut, 8192) == big  # 133 of them: the bucket's sequential tile
    facts15 = QWEN2_05B.facts("matmul", {"n": 1536, "k": 8960})
    down15 = solve(matmul_program, facts15).commit(pins={"chunk": 1792})
    assert all(tile(down15, m) == mid_p and not down15(m).tile_parallel for m in (513, 640, 704))  # to 132 tiles
    assert tile(down15, 705) == big
    two = solve(matmul_program, facts15).commit(pins={"chunk": 4480})  # two chunks: 120 units at M = 640
    assert two(640).tile_parallel and tile(two, 641) == mid_p and tile(two, 705) == big
    assert not any(cut(m).tile_wgmma for m in (1, 32, 64)) and all(cut(m).tile_parallel for m in (1, 32, 64))
    assert all(tile(cut, m) == row(SPLIT_WGMMA_SMALL) and cut(m).tile_parallel for m in (65, 128))
    assert all(tile(cut, m) == row(SPLIT_WGMMA_WIDE) and cut(m).tile_parallel for m in (129, 256, 512))
    assert not cut(769).tile_parallel
    for sel in (qkv, gate_up, head, down, cut, down15, two, tuned):
        assert len({sel(m).chunk for m in (1, 33, 65, 300, 513, 4096)}) == 1


def test_a_batch_1_call_takes_the_narrow_tile_where_the_wide_one_leaves_sms_idle():
    """At M <= 16 the default runs 16 x 32 tiles (twice the programs) where the bucket's 16 x 64 tiles, times the
    chunks, number under NARROW_FILL an SM: every 0.5B and 1.5B site below WIDE_N (the LM head and the 1.5B gate_up
    take the 512 bucket's tile), and on a 66-SM part not the 0.5B gate_up (152 tiles); not from M = 17, not when
    the schedule does not follow M, and a tuned tile_32 keeps its choice. The rule moves the tile, never the
    partition."""
    from detent_rl.kernels.programs.matmul import NARROW_CHOICE, SCHEDULES, TILE_CHOICES

    narrow, wide = TILE_CHOICES[32][NARROW_CHOICE], SCHEDULES[32]
    shape = lambda s: (s.tile_block_m, s.tile_block_n, s.tile_wgmma)  # noqa: E731
    assert (narrow.block_m, narrow.block_n, wide.block_m, wide.block_n) == (16, 32, 16, 64)
    for n, k in ((1152, 896), (896, 896), (9728, 896), (896, 4864), (2048, 1536), (1536, 1536), (1536, 8960)):
        sel = _selectors(n, k)[1]
        assert shape(sel(1)) == shape(sel(16)) == (16, 32, False), (n, k, shape(sel(1)))
        assert shape(sel(17))[1] != 32 and shape(sel(32))[1] != 32, (n, k)
        assert sel(1).chunk == sel(17).chunk == sel(4096).chunk
        sol = solve(matmul_program, QWEN2_05B.facts("matmul", {"n": n, "k": k}))
        if k > n:  # the chunks the model pins (bench/tuned's defaults): 8 and 5 of them, in parallel programs
            cut = sol.commit(pins={"chunk": 640 if k == 4864 else 1792})
            assert shape(cut(1)) == (16, 32, False) and cut(1).tile_parallel and cut(1).chunk == cut(17).chunk
        assert shape(sol.commit(knobs={"tile_32": 2})(1)) == (16, 64, False)  # tuned: ROWS16 kept
        assert shape(sol.commit(knobs={"schedule_by_m": False})(1))[1] != 32
    for n, k in ((151936, 896), (17920, 1536)):
        assert shape(_selectors(n, k)[1](1)) == (64, 128, False)
    small_part = dataclasses.replace(QWEN2_05B, num_sms=66)
    for n, k, takes in ((9728, 896, False), (1152, 896, True)):
        sel = solve(matmul_program, small_part.facts("matmul", {"n": n, "k": k})).commit()
        assert shape(sel(1)) == ((16, 32, False) if takes else (16, 64, False)), (n, k, shape(sel(1)))
