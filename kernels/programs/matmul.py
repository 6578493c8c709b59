"""Selection program of our matmul / linear family (`kernels/matmul.py`).

Two kinds of value come out. `chunk`, the K partition — K cut into chunks of `chunk` elements, each
summed from a fresh fp32 accumulator, the chunk sums added in order — decides a row's bits. The
`tile` record — tile shape, warps, stages, and whether the chunks run in parallel CTAs (combined in
order through a workspace) or one after another in one CTA — decides none of them (measured on the
H200 for every 0.5B/1.5B site, tests/test_kernels_matmul_gpu.py): it is declared the program's
schedule, which may follow M, and the cut leaves it alone.

Stock selection is a split-K GEMM's, as engines ship decode GEMMs: the schedule keyed on M's bucket,
and K split just enough for the output tiles to fill the SMs. A decode step's rows are thus summed
in more, shorter chunks than a prefill's — the classic source of batch-dependent bits. The cut
pins `chunk` (one partition for every M) and lets the schedule follow M: a small-M call runs the
pinned chunks in parallel, a large-M call runs them in sequence inside big tiles.

The `schedule_by_m` knob turns that off (the largest bucket's schedule for every M): what the det
arm runs, the way engines' deterministic modes fix one GEMM config for every batch (with `tile_8192` 1,
their bf16 config: `selections.det_assignment`). The
`tile_<bucket>` knobs pick each bucket's schedule among a few (TILE_CHOICES): bit-neutral, so the
tuner may choose them per site and per M bucket.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Unpinnable, assume, knob, record, require, selection


@record
class GemmSchedule:
    parallel: bool  # the chunks in parallel CTAs (decode) or in sequence inside one CTA
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    wgmma: bool  # sequential chunks by hand-issued warpgroup MMAs (kernels/matmul_wgmma.py) where it applies
    swap_ab: bool  # (wgmma) each tile computed transposed: w's rows the MMA's 64-row side, x's its N
    persistent: bool  # (wgmma) as many programs as the SMs hold, each running a few tiles in turn


def _s(parallel: bool, block_m: int, block_n: int, block_k: int, group_m: int, num_warps: int,
       num_stages: int, wgmma: bool = False, swap_ab: bool = False, persistent: bool = False) -> GemmSchedule:
    return GemmSchedule(parallel=parallel, block_m=block_m, block_n=block_n, block_k=block_k, group_m=group_m,
                        num_warps=num_warps, num_stages=num_stages, wgmma=wgmma, swap_ab=swap_ab,
                        persistent=persistent)


# Per bucket (the largest M it serves, in increasing order), the schedules a tuner may pick with the
# bucket's `tile_<bucket>` knob; the first is the default. The defaults are the H200's best tiles over
# a grid (bench/matmul_sweep.py, docs/BENCHMARKS.md) for the Qwen2 0.5B/1.5B sites; every entry's
# bit-neutrality is re-measured by tests/test_kernels_matmul_gpu.py.
SMALL_WGMMA = _s(False, 64, 64, 64, 8, 4, 6, wgmma=True)  # one warpgroup, a ring of 6 K blocks
SMALL_WGMMA_RING4 = _s(False, 64, 64, 64, 8, 4, 4, wgmma=True)  # the same with a ring of 4 (more CTAs an SM)
# a decode batch of 17-32 rows: x's 32 rows in the MMA's N slot, 64 rows of w its A side (swapped)
SWAP_WGMMA = _s(False, 32, 64, 64, 8, 4, 6, wgmma=True, swap_ab=True)
ROWS16 = _s(False, 16, 64, 128, 1, 4, 4)  # the 32 bucket's sequential Triton tile; also M 33-64 on narrow outputs
# K blocks of 128 (half the MMA waits and TMA issues), a few tiles a program
DEEP_WGMMA_P = _s(False, 128, 128, 128, 8, 8, 3, wgmma=True, persistent=True)
# K whole only (one fp32 tile in registers); choice 4 was this tile one a program, retired in session 18
WIDE_WGMMA_P = _s(False, 128, 256, 64, 8, 8, 3, wgmma=True, persistent=True)
# where K is cut, the chunks in parallel programs of the warpgroup kernel (`split`: TMA loads, each chunk's fp32 sum
# stored whole-tile to the workspace the parallel form adds in order); K whole, the same tiles run in sequence
SPLIT_WGMMA_SMALL = _s(True, 64, 64, 64, 8, 4, 6, wgmma=True)
SPLIT_WGMMA_WIDE = _s(True, 128, 128, 64, 8, 8, 4, wgmma=True, persistent=True)
MID_WGMMA_P = _s(False, 64, 128, 64, 8, 4, 4, wgmma=True, persistent=True)  # 64 x 128, a few tiles a program
TILE_CHOICES = {  # per bucket, choice index -> schedule (an index keeps its meaning in every bucket it is in)
    32: {0: _s(True, 16, 64, 128, 1, 4, 4), 1: _s(True, 16, 32, 128, 1, 4, 4), 2: ROWS16, 6: SWAP_WGMMA},
    128: {0: _s(True, 64, 64, 64, 4, 4, 3), 1: _s(True, 32, 64, 64, 4, 4, 4), 2: _s(False, 64, 128, 64, 8, 4, 3),
          3: SMALL_WGMMA, 5: SMALL_WGMMA_RING4, 7: ROWS16, 10: SPLIT_WGMMA_SMALL},
    512: {0: _s(True, 64, 128, 64, 8, 4, 3), 1: _s(True, 64, 64, 64, 8, 4, 4), 2: _s(False, 128, 128, 64, 8, 8, 3),
          3: SMALL_WGMMA, 5: SMALL_WGMMA_RING4, 8: DEEP_WGMMA_P, 9: WIDE_WGMMA_P, 10: SPLIT_WGMMA_WIDE,
          11: MID_WGMMA_P},
    2048: {0: _s(False, 128, 128, 64, 8, 8, 3), 1: _s(False, 128, 256, 64, 8, 8, 3), 2: _s(False, 64, 128, 64, 8, 4, 3),
           3: _s(False, 128, 128, 64, 8, 8, 4, wgmma=True), 5: SMALL_WGMMA_RING4, 8: DEEP_WGMMA_P, 9: WIDE_WGMMA_P,
           10: SPLIT_WGMMA_WIDE, 11: MID_WGMMA_P},
    8192: {0: _s(False, 128, 256, 64, 8, 8, 3), 1: _s(False, 128, 128, 64, 8, 8, 3),
           3: _s(False, 128, 128, 64, 8, 8, 4, wgmma=True), 8: DEEP_WGMMA_P, 9: WIDE_WGMMA_P},
}
# From M = 513 a site whose K is cut into chunks (K > N: the down projections) runs the chunks in
# sequence by hand-issued warpgroup MMAs (choice 3; the Triton tile where that does not apply): at
# M = 2,048 / 8,192 the 0.5B down projection took 1.29x / 1.26x cuBLAS that way against 1.88x / 1.70x
# in the Triton kernel, the 1.5B one 1.32x / 1.16x against 1.89x / 1.51x (H200,
# bench/gemm_wgmma_probe.py, docs/BENCHMARKS.md). Since session 18 the K-whole sites take persistent warpgroup
# tiles from M = 513 too (below). No knob names choice 3 any more: the cut K reaches it through choice 0.
WGMMA_CHOICE = 3
# Where K is whole (one chunk: qkv, o, gate_up, the LM head) in the 128 and 512 buckets (M 33-512: a
# decode batch, short prefills), warpgroup MMAs in 64 x 64 tiles fed by a TMA ring of 6 (choice 3) ran
# 1.06-1.28x cuBLAS on the 0.5B/1.5B qkv and o sites at M = 128-512, where the Triton kernel's best
# tile took 1.39-1.95x (H200, bench/gemm_wgmma_probe.py, docs/BENCHMARKS.md, session 16); they take
# it by default while its tiles number at most SMALL_TILES_PER_SM a multiprocessor (gate_up at 256 has
# 608 and ran as fast in the Triton 64 x 128 tile); past two a multiprocessor the ring is 4 (the 0.5B
# gate_up at M = 128, 304 tiles: 8.4 us with a ring of 4 (choice 5), 11.3 with 6; the 1.5B qkv at 512, 256 tiles:
# 9.0 with 6, 10.0 with 4). The LM head (n >= VOCAB_N) runs 128 x 256 warpgroup tiles from M = 65
# (choice 4; persistent, choice 9, since session 18): 1.07-1.15x cuBLAS at M = 128-2,048 against the Triton
# kernel's 1.13-1.29x (the 1.5B gate_up, 17,920 wide, ran 15 % slower so at M = 256: it keeps the Triton
# tile). Not below M = 65: at M = 1-32 the 128 x 256 warpgroup tile took 1.24-1.42x cuBLAS against 0.99x in
# Triton tiles (a tuple with `schedule_by_m` off, which keeps one schedule for every M, keeps the Triton one).
SMALL_WGMMA_CHOICE, SMALL_WGMMA_RING4_CHOICE = 3, 5
# Decode batches, K whole (H200, bench/gemm_wgmma_probe.py --ms 8,32,64, docs/BENCHMARKS.md, session 17): on an
# output wide enough that its 64-column tiles number at least the SMs (gate_up), M 17-32 runs swapped warpgroup
# tiles (choice 6: 0.5B gate_up at M = 32 7.5 us, 1.03x cuBLAS, against 8.4-10.2 in Triton tiles); below that
# width (qkv, o) M 33-64 keeps the 32 bucket's 16 x 64 Triton tile (choice 7: the 0.5B qkv / o at M = 64 4.5 / 4.3
# us, 0.96x cuBLAS, against 5.6 / 5.4 in the 64 x 64 warpgroup tile, whose 14-18 CTAs leave most SMs idle).
SWAP_WGMMA_CHOICE, ROWS16_CHOICE = 6, 7
# Large M, K whole, 16-bit operands (H200, session 18, docs/BENCHMARKS.md): persistent programs (the ring running on
# from tile to tile, a tile's store under the next one's MMAs; bench/gemm_wgmma_probe.py --no-triton) ran the 0.5B
# gate_up at M = 512 / 2,048 in 18.1-19.9 / 57.4 us against 21.8-23.2 / 62.5 one tile a program. From M = 513 these
# sites take the persistent 128 x 256 tile (choice 9) while those tiles number at least half the SMs, else the
# persistent 128 x 128 tile of 128-element K blocks (choice 8: the 0.5B o at 2,048); M 257-512 on outputs too wide
# for the small tiles (gate_up) takes choice 8 too. Through the engine's selection (python -m detent_rl.bench
# --cases gemm) the 0.5B o, gate_up and LM head ran 0.97-1.08x cuBLAS at M = 2,048 / 8,192 (session 17's Triton
# tiles: 1.09-1.20x), qkv 1.44 / 1.26x (1.46 / 1.40x), gate_up at 512 1.26x (1.34x). The cut K (down) keeps
# choice 3: K blocks of 128 ran it no faster (33.3 against 33.2 us at M = 2,048).
DEEP_WGMMA_P_CHOICE, WIDE_WGMMA_P_CHOICE = 8, 9
# A cut K at M 65-512 (the down projections at a GRPO batch's decode width): the parallel form in the warpgroup
# kernel (choice 10: 64 x 64 tiles, a ring of 6, at M 65-128; persistent 128 x 128 tiles, a ring of 4, at 129-512)
# while its units (tiles x chunks) number at least half the SMs. H200, bench/gemm_wgmma_probe.py (session 24,
# docs/BENCHMARKS.md), 0.5B down (chunk 640) at M = 128 / 256 / 512: 9.1 / 12.2 / 18.4 us against the parallel
# Triton rows' ~9.7 / 12.3 / 21.6 (cuBLAS 8.5 / 10.8 / 11.0); 1.5B down (chunk 1,792) at 128 / 256: 14.2 / 20.1
# (cuBLAS 13.2 / 19.1). K whole, the persistent 64 x 128 tile of 64-element K blocks (choice 11) where choice 8 ran
# before at M 257-512 (the 0.5B gate_up at 512: 18.3 against 20.0 us, cuBLAS 16.0), and from M = 513 to 2,048 on
# outputs that 256-column tiles do not divide (the 0.5B qkv, 1,152 wide, at 2,048: 12.1 against 13.0-14.1).
# Below M = 257 it takes choice 11 where its tiles number at least MID_TILES_PER_SM a multiprocessor (a persistent
# program then runs several): the 1.5B gate_up (17,920 wide) at M = 256, 560 tiles, 31.6 against 34.4 us in the
# Triton 64 x 128 tile (cuBLAS 25.1; session 29: 32.1 against ~36), while the 0.5B gate_up at 256 (304 tiles) ran
# 12.9 against 12.1 (H200, our PDL off, .devrun-style probe; docs/BENCHMARKS.md, session 30).
SPLIT_WGMMA_CHOICE, MID_WGMMA_P_CHOICE = 10, 11
MID_TILES_PER_SM = 4
# A cut K at M 513-2,048 whose 64 x 128 tiles fit one wave (the 0.5B down projection to M = 1,152, the 1.5B one to
# 704) runs its chunks in sequence in them (choice 11: persistent, but with no more tiles than SMs each program runs
# one), where the 128 x 128 tiles leave half the SMs idle -- unless the parallel form's units (M <= FILL_M) fit two
# waves: its combine then costs less than the longer tiles. H100, bench/partition_probe.py (session 44,
# docs/BENCHMARKS.md; its grid ran the tile one a program), at the default partitions: the 0.5B down (chunk 640) at
# M = 640 / 1,024 in 23.4 / 23.9 us against the parallel form's 26.2 and the 128 x 128 tile's 30.6 (cuBLAS 13.0 /
# 17.8); the 1.5B down (1,792) at 640 in 43.9 against 51.9 (cuBLAS 29.6). Past one wave it lost (the 0.5B down at
# 2,048: 46.3 against 36.0, persistent or not; the 1.5B at 1,024: 65.0 against 56.8).
assert (SPLIT_WGMMA_SMALL.block_m, SPLIT_WGMMA_SMALL.block_n, SPLIT_WGMMA_WIDE.block_m, SPLIT_WGMMA_WIDE.block_n) == \
    (64, 64, 128, 128), "the program's unit count below assumes these tiles"
SMALL_TILES_PER_SM = 3
VOCAB_N = 65536
SCHEDULES = {bucket: choices[0] for bucket, choices in TILE_CHOICES.items()}  # the defaults
# one flat table for the program: key bucket * 8 + choice
TILES = {bucket * 8 + i: row for bucket, choices in TILE_CHOICES.items() for i, row in choices.items()}
# The LM head (N = 151,936) at M = 32 ran at 1.82x cuBLAS in the small-M buckets' 16x64 tiles and at
# 1.0x in 64x128 ones (H200, bench/kernels_matmul_bench.py); its N tiles alone fill the SMs
WIDE_N = 16384
# In the 512 bucket (M 129-512: a GRPO batch's decode) a call whose 64x128 tiles, times its parallel
# chunks, fill fewer than half the SMs takes the bucket's 64x64 choice instead: at M = 256 the qkv and
# o projections ran 1.26-1.29x cuBLAS in 64x64 tiles, gate_up 1.14x in 64x128, and the split down
# projection 1.12x in parallel 64x128 chunks where the sequential form took 2.0x (H200,
# bench/matmul_sweep.py, docs/BENCHMARKS.md)
FILL_SHARE = 2
FILL_M = 768  # the 2,048 bucket's fill rule (below) holds up to here: at M = 1,024 it lost (H100, session 40)
CHUNK_ALIGN = 128  # chunks are whole multiples of this: every schedule's BLOCK_K divides it
# M <= 16 (a batch-1 decode): where the 16 x 64 tiles, times the chunks, number under NARROW_FILL a multiprocessor,
# 16 x 32 tiles (choice 1) twice as many programs stream the weight. A schedule knob, bit-neutral (the GPU rows tests).
# The default's batch-1 step with it against without, each arm in its own process: 0.5B 0.905 against 0.968 ms,
# 1.5B 1.883 against 1.938 (H100, session 62, docs/probes/session62; every batch-1 tune had chosen it already).
NARROW_M, NARROW_FILL, NARROW_CHOICE = 16, 2, 1


@selection
def gemm_bucket(m: Unpinnable[int]):
    """The smallest table key that is at least m (the last key for anything larger)."""
    bucket = 8192
    for k in (2048, 512, 128, 32):
        if m <= k:
            bucket = k
    return bucket


@selection(name="matmul", schedule=("tile",))
def matmul_program(m: Unpinnable[int], n: Fact[int], k: Fact[int], max_m: Fact[int], num_sms: Fact[int],
                   smem_bytes: Fact[int], dtype_bytes: Fact[int]):
    assume(1 <= m <= max_m)
    by_m = knob("schedule_by_m", (True, False), True)
    t32 = knob("tile_32", (0, 1, 2, 6), 0)  # each bucket's TILE_CHOICES keys
    t128 = knob("tile_128", (0, 1, 2, 3, 5, 7), 0)
    # (rows the rules reach that no knob names: 9, 10 and 11 in the 512 bucket, 10 in the 128 one, 11 in the 2048
    # one (a cut K too, from session 44); 3 from 2048, the cut K's default, which choice 0 reaches. The knobs' product
    # times the tile key's values stays small enough to enumerate (selir.vra.MAX_ASSIGNMENTS;
    # tests/test_selection_programs.py enumerates the program without its schedule declaration): for rows 10 and
    # 11, the 8192 bucket's 128 x 128 Triton tile of 32-element K blocks (choice 2, never tuned in) left the table)
    t512 = knob("tile_512", (0, 1, 2, 3, 5, 8), 0)
    t2048 = knob("tile_2048", (0, 1, 2, 8, 9), 0)
    t8192 = knob("tile_8192", (0, 1, 8, 9), 0)
    bucket = gemm_bucket(m) if by_m else 8192
    natural = bucket
    if n >= WIDE_N and bucket < 512:
        bucket = 512  # an output this wide fills the SMs with 64x128 tiles at any M
    choice = t8192
    if bucket == 32:
        choice = t32
    if bucket == 128:
        choice = t128
    if bucket == 512:
        choice = t512
    if bucket == 2048:
        choice = t2048
    # split-K as decode GEMMs pick it: a reduction longer than the output is wide (K > N), under the
    # bucket's default parallel (small-M) schedule, is split until the output tiles fill the SMs; nothing
    # else splits (the partition does not follow the tile knobs)
    base = SCHEDULES[bucket]
    tiles = (m + base.block_m - 1) // base.block_m * ((n + base.block_n - 1) // base.block_n)
    splits = max(1, min(num_sms // tiles, k // CHUNK_ALIGN)) if base.parallel and k > n else 1
    chunk = ((k + splits - 1) // splits + CHUNK_ALIGN - 1) // CHUNK_ALIGN * CHUNK_ALIGN
    if choice == 0 and chunk >= k and n >= VOCAB_N and m > (64 if by_m else max_m):  # not when M is not read
        choice = WIDE_WGMMA_P_CHOICE
    small_tiles = (m + 63) // 64 * ((n + 63) // 64)
    wide = (n + 63) // 64 >= num_sms  # one row of 64-column tiles fills the SMs
    if choice == 0 and chunk >= k and bucket == 32 and m > 16 and wide:
        choice = SWAP_WGMMA_CHOICE
    if choice == 0 and bucket == 32 and m <= NARROW_M and tiles * ((k + chunk - 1) // chunk) < NARROW_FILL * num_sms:
        choice = NARROW_CHOICE
    if choice == 0 and chunk >= k and bucket == 128 and m <= 64 and not wide:
        choice = ROWS16_CHOICE
    if choice == 0 and chunk >= k and 128 <= natural <= 512 and small_tiles <= SMALL_TILES_PER_SM * num_sms:
        choice = SMALL_WGMMA_CHOICE
        if small_tiles > 2 * num_sms:  # many tiles: a shorter ring lets more CTAs share a multiprocessor
            choice = SMALL_WGMMA_RING4_CHOICE
    mid_tiles = (m + 63) // 64 * ((n + 127) // 128)
    if (choice == 0 and chunk >= k and bucket == 512 and dtype_bytes == 2
            and (m > 256 or (natural == 512 and mid_tiles >= MID_TILES_PER_SM * num_sms))):
        choice = MID_WGMMA_P_CHOICE  # (the small tiles' rule above took the narrower outputs)
    split_tile = 64 if bucket == 128 else 128  # the square tiles of SPLIT_WGMMA_SMALL and SPLIT_WGMMA_WIDE
    split_units = (m + split_tile - 1) // split_tile * ((n + split_tile - 1) // split_tile) * ((k + chunk - 1) // chunk)
    if (choice == 0 and chunk < k and dtype_bytes == 2 and bucket in (128, 512) and natural == bucket and m > 64
            and split_units * FILL_SHARE >= num_sms):
        choice = SPLIT_WGMMA_CHOICE
    if bucket == 512 and choice == 0 and tiles * ((k + chunk - 1) // chunk) * FILL_SHARE < num_sms:
        choice = 1
    if bucket >= 2048 and choice == 0 and k > n:
        choice = WGMMA_CHOICE
    if by_m and bucket >= 2048 and choice == 0 and chunk >= k and dtype_bytes == 2:  # (reads M)
        wide_tiles = (m + 127) // 128 * ((n + 255) // 256)
        choice = WIDE_WGMMA_P_CHOICE if wide_tiles * 2 >= num_sms else DEEP_WGMMA_P_CHOICE
        if bucket == 2048 and n % 256 != 0:
            choice = MID_WGMMA_P_CHOICE
    # M 513-768 (a serve's eager steps), where the bucket's 128-row tiles leave most SMs idle: the 1.5B down
    # projection at M = 640 ran sequential chunks in 60 tiles on 132 SMs, the 0.5B one in 35, the 1.5B o in 60 (a
    # 40-row decode beside two 288-token chunks: detent's GEMMs 1.40x cuBLAS's, session 39). A cut K then runs its
    # chunks in parallel programs while the sequential tiles number under half the SMs (the 512 bucket's form: its
    # combine grows with M); K whole, the 64 x 64 warpgroup tiles while the bucket's tile numbers under the SMs (the
    # 512 bucket's 1.5B qkv / o rule). At M = 640 that took the 1.5B o from 1.69x cuBLAS to 1.40-1.44x, its qkv from
    # 1.34x to 1.23x, its down from 1.69x to 1.55-1.63x and the 0.5B down from 2.35x to 1.91x; at 1,024 the 1.5B qkv
    # went from 1.14x to 1.83x and the 0.5B down from 1.66x to 2.04x, hence FILL_M (H100, session 40,
    # docs/BENCHMARKS.md). The default only: a tuned `tile_2048` keeps its choice.
    if by_m and bucket == 2048 and t2048 == 0 and dtype_bytes == 2 and m <= FILL_M:
        wide_rows = (m + 127) // 128
        if chunk < k and wide_rows * ((n + 127) // 128) * FILL_SHARE < num_sms:
            choice = SPLIT_WGMMA_CHOICE
        big = TILES[bucket * 8 + choice]
        if chunk >= k and (m + big.block_m - 1) // big.block_m * ((n + big.block_n - 1) // big.block_n) < num_sms:
            choice = SMALL_WGMMA_RING4_CHOICE
    if by_m and bucket == 2048 and t2048 == 0 and dtype_bytes == 2 and chunk < k:
        seq_mid_tiles = (m + 63) // 64 * ((n + 127) // 128)  # (split_units above: the parallel form's, 128 x 128)
        if seq_mid_tiles <= num_sms and not (choice == SPLIT_WGMMA_CHOICE and split_units <= 2 * num_sms):
            choice = MID_WGMMA_P_CHOICE
    row = TILES[bucket * 8 + choice]
    # as Triton's autotuner prunes: no more pipeline stages than shared memory holds (fp32 tiles are twice
    # the bytes of the bf16 ones the table was written for)
    stage = (row.block_m + row.block_n) * row.block_k * dtype_bytes
    stages = min(row.num_stages, smem_bytes // stage)
    tile = GemmSchedule(parallel=row.parallel and chunk < k, block_m=row.block_m, block_n=row.block_n,
                        block_k=row.block_k, group_m=row.group_m, num_warps=row.num_warps, num_stages=stages,
                        wgmma=row.wgmma, swap_ab=row.swap_ab, persistent=row.persistent)
    require(stages >= 1, "one stage of the tiles must fit in shared memory")
    require(chunk % CHUNK_ALIGN == 0 and chunk >= CHUNK_ALIGN, "a chunk is whole BLOCK_K blocks of every schedule")
    return {"chunk": chunk, "tile": tile}


# The MLP down-projection of a 0.5B-class Qwen2 (intermediate 4864 -> hidden 896) on one H200.
REFERENCE_FACTS = {"n": 896, "k": 4864, "max_m": 8192, "num_sms": 132, "smem_bytes": 227 * 1024, "dtype_bytes": 2}

PROGRAM = matmul_program
