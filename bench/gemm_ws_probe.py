"""Probe: the K partition's sequential form with warp specialization, its warpgroups' chunk ends apart in time.

    python3 -P bench/gemm_ws_probe.py [--cases down05,down15,qkv05,...] [--ms 512,1024,2048,8192] [--chunks ...]
    python3 -P bench/gemm_ws_probe.py --smoke        # GPU, first, under `timeout`: a wrong barrier phase hangs
    python -P bench/gemm_ws_probe.py --compile-only  # any machine (Triton >= 3.6): sm_90a registers, spills, smem

Where K is cut into chunks, `matmul_wgmma`'s kernel waits at each chunk's end for that chunk's MMAs before the total
takes the sum; both warpgroups of a 128-row tile wait at once and the tensor cores idle (4-21 % of the down
projections' time at M >= 2,048, session 31). Here one warp loads the TMA ring and each 64-row slice of the tile has
its own warpgroup (`gl.warp_specialize`), summing its rows exactly as `linear` does (a fresh accumulator a chunk,
the sums added in order, then the bias, one rounding): the partition's bits. Each warpgroup starts `lag` K blocks
behind the one before, so that while one waits the others' MMAs run; a slot is freed when every warpgroup is done
with it. 192-row tiles (three warpgroups) too: the 1.5B down projection at M = 2,048 is 132 of them, against 192
tiles of 128 rows (1.45 waves). K-whole sites (one accumulator) also get 128 x 256 tiles.

Per case, partition and M: cuBLAS, the selection, the current sequential form, K whole (another partition: the
bound), and every variant of this kernel, each output compared bit for bit with `linear`'s; control: K whole (or,
where K is whole, cuBLAS) must differ. CUDA-graph replays over cold weight copies, median µs.
`bench/ws_protocol_check.py` model-checks the barrier protocol on the CPU; keep it in step with the kernel.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as e:  # a Triton without Gluon's Hopper API
    sys.exit(f"gemm_ws_probe: needs Triton's Gluon (3.6 or later): {e}")

from detent_rl.kernels.matmul import linear
from detent_rl.kernels.matmul_wgmma import _tile_offsets, tma_load, tma_store
from detent_rl.kernels.matmul_wgmma_plan import linear_wgmma
from detent_rl.timing import graph_seconds

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from partition_probe import baseline, deployment, partitions, site_operands  # noqa: E402
from sm90_compile import gluon_resources  # noqa: E402

CASES = {  # n, k, the default tuple's chunk, bias: the cut sites, then K-whole ones (one accumulator: 256 columns fit)
    "down05": (896, 4864, 640, False), "down15": (1536, 8960, 1792, False),
    "qkv05": (1152, 896, 896, True), "o05": (896, 896, 896, False), "gate_up05": (9728, 896, 896, False),
    "qkv15": (2048, 1536, 1536, True), "o15": (1536, 1536, 1536, False)}
HALF = 64  # a warpgroup's rows of a tile
SMEM_BYTES = 227 * 1024


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, GROUP_M: gl.constexpr, NUM_K: gl.constexpr,
                    NUM_BUFFERS: gl.constexpr):
    """The loads: K block after K block of this program's tiles into the ring, a slot once every warpgroup freed it
    (x's rows 64 at a time: a TMA block's sides are powers of two, a tile's rows 128 or 192)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    HALVES: gl.constexpr = a_bufs.type.shape[0] // NUM_BUFFERS
    BLOCK_M: gl.constexpr = HALVES * HALF
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    i = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for kb in range(NUM_K):
            slot = i % NUM_BUFFERS
            mbarrier.wait(empty.index(slot), ((i // NUM_BUFFERS) & 1) ^ 1)  # (a fresh barrier passes phase 1)
            mbarrier.expect(ready.index(slot), HALVES * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            for r in gl.static_range(HALVES):
                tma_load(a_desc, [off_m + r * HALF, kb * BLOCK_K], ready.index(slot),
                                                a_bufs.index(slot * HALVES + r))
            tma_load(b_desc, [off_n, kb * BLOCK_K], ready.index(slot), b_bufs.index(slot))
            i += 1


@gluon.jit
def _half_partition(a_bufs, b_bufs, ready, empty, starts, c_desc, c_buf, bias_ptr, M, N, HAS_BIAS: gl.constexpr,
                    ROW: gl.constexpr,
                    GROUP_M: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr,
                    NUM_BUFFERS: gl.constexpr, LAG: gl.constexpr):
    """One warpgroup: rows ROW..ROW+63 of each of this program's tiles, its chunk sums added in chunk order. The
    warpgroup of the rows above waits (once) until this one has issued LAG blocks (`starts`): LAG blocks apart."""
    HALF: gl.constexpr = c_buf.type.shape[0]
    HALVES: gl.constexpr = a_bufs.type.shape[0] // NUM_BUFFERS
    BLOCK_M: gl.constexpr = HALVES * HALF
    BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
    R: gl.constexpr = ROW // HALF  # this warpgroup's place: 0 leads
    NUM_K: gl.constexpr = NUM_CHUNKS * CHUNK_BLOCKS
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    my_blocks = (num_tiles - gl.program_id(0) + gl.num_programs(0) - 1) // gl.num_programs(0) * NUM_K
    if R > 0:
        if LAG > 0:
            mbarrier.wait(starts.index(R - 1), 0)
    i = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=layout)
        total = acc  # (K whole: never read, so never kept)
        for kb in range(NUM_K):
            slot = i % NUM_BUFFERS
            j = kb % CHUNK_BLOCKS
            if NUM_CHUNKS > 1:
                if (j == 0) & (kb > 0):  # the chunk before is issued: wait for its sum, free its last slot, fold it
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(empty.index((i - 1) % NUM_BUFFERS), count=1)
                    if kb == CHUNK_BLOCKS:
                        total = acc
                    else:
                        total = total + acc
            mbarrier.wait(ready.index(slot), (i // NUM_BUFFERS) & 1)
            acc = warpgroup_mma(a_bufs.index(slot * HALVES + R), b_bufs.index(slot).permute((1, 0)), acc,
                                use_acc=j != 0, is_async=True)  # a chunk's first block starts from zero
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # block i - 1's MMA is done
            if j != 0:  # (a chunk's first block: the fold above freed block i - 1's slot)
                mbarrier.arrive(empty.index((i - 1) % NUM_BUFFERS), count=1)
            if R < HALVES - 1:
                if LAG > 0:
                    if i == gl.minimum(my_blocks, LAG) - 1:  # LAG blocks issued (or all of them): the next may go
                        mbarrier.arrive(starts.index(R), count=1)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((i - 1) % NUM_BUFFERS), count=1)
        if NUM_CHUNKS == 1:
            total = acc
        else:
            total = total + acc
        if HAS_BIAS:  # after the chunk sums, before the one rounding: `linear`'s order
            offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
            total = total + gl.expand_dims(gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32), 0)
        tma.store_wait(pendings=0)  # the previous tile's store has read the buffer
        c_buf.store(total.to(c_desc.dtype))
        fence_async_shared()
        tma_store(c_desc, [off_m + ROW, off_n], c_buf)  # rows past M are clipped
    tma.store_wait(pendings=0)


@gluon.jit
def ws_chunked_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, HAS_BIAS: gl.constexpr, HALVES: gl.constexpr,
                      GROUP_M: gl.constexpr,
                      NUM_CHUNKS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr, NUM_BUFFERS: gl.constexpr,
                      LAG: gl.constexpr, REGS: gl.constexpr):
    """out (c_desc: 64-row blocks) = a @ b^T under the K partition (NUM_CHUNKS chunks of CHUNK_BLOCKS K blocks) in
    tiles of 128 or 192 rows: the default partition and one or two worker warpgroups each take 64 rows of every tile
    (REGS registers a thread each), one worker warp loads."""
    HALF: gl.constexpr = c_desc.block_type.shape[0]
    NUM_K: gl.constexpr = NUM_CHUNKS * CHUNK_BLOCKS
    # x's rows a slot as HALVES 64-row blocks (shared memory's sides, like TMA's, are powers of two)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_BUFFERS * HALVES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [HALVES] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    starts = gl.allocate_shared_memory(gl.int64, [HALVES - 1, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_BUFFERS):
        mbarrier.init(ready.index(s), count=1)  # the loader's expected bytes
        mbarrier.init(empty.index(s), count=HALVES)  # every warpgroup done with the slot
    for s in gl.static_range(HALVES - 1):
        mbarrier.init(starts.index(s), count=1)
    fence_async_shared()  # the initialised barriers seen by TMA's completions (the async proxy)
    # (a warp_specialize argument is a tensor, a descriptor or a constexpr: no plain int; no tuple arithmetic)
    gl.static_assert(HALF == 64, "a warpgroup's 64 rows")
    row0: gl.constexpr = 0
    row1: gl.constexpr = 64
    row2: gl.constexpr = 128
    if HALVES == 2:
        gl.warp_specialize([
            (_half_partition, (a_bufs, b_bufs, ready, empty, starts, c_desc, c_bufs.index(0), bias_ptr, M, N,
                               HAS_BIAS, row0, GROUP_M, NUM_CHUNKS, CHUNK_BLOCKS, NUM_BUFFERS, LAG)),
            (_half_partition, (a_bufs, b_bufs, ready, empty, starts, c_desc, c_bufs.index(1), bias_ptr, M, N,
                               HAS_BIAS, row1, GROUP_M, NUM_CHUNKS, CHUNK_BLOCKS, NUM_BUFFERS, LAG)),
            (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, GROUP_M, NUM_K, NUM_BUFFERS))],
            [4, 1], [REGS, 40])
    else:
        gl.warp_specialize([
            (_half_partition, (a_bufs, b_bufs, ready, empty, starts, c_desc, c_bufs.index(0), bias_ptr, M, N,
                               HAS_BIAS, row0, GROUP_M, NUM_CHUNKS, CHUNK_BLOCKS, NUM_BUFFERS, LAG)),
            (_half_partition, (a_bufs, b_bufs, ready, empty, starts, c_desc, c_bufs.index(1), bias_ptr, M, N,
                               HAS_BIAS, row1, GROUP_M, NUM_CHUNKS, CHUNK_BLOCKS, NUM_BUFFERS, LAG)),
            (_half_partition, (a_bufs, b_bufs, ready, empty, starts, c_desc, c_bufs.index(2), bias_ptr, M, N,
                               HAS_BIAS, row2, GROUP_M, NUM_CHUNKS, CHUNK_BLOCKS, NUM_BUFFERS, LAG)),
            (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, GROUP_M, NUM_K, NUM_BUFFERS))],
            [4, 4, 1], [REGS, REGS, 24])


def _layout(rows: int, cols: int, dt):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dt)


def ring_depth(block_m: int, block_n: int, block_k: int, asked: int, num_k: int) -> int:
    """The ring's slots: as asked, at most what shared memory holds beside the warpgroups' store buffers."""
    stage = (block_m + block_n) * block_k * 2
    return max(2, min(asked, (SMEM_BYTES - 2048 - block_m * block_n * 2) // stage, num_k))


def meta(k: int, chunk: int, block_m: int, block_n: int, block_k: int, ring: int, lag: int) -> dict:
    assert block_m in (2 * HALF, 3 * HALF), "a warpgroup a 64-row slice of the tile: 128 or 192 rows"
    chunk = min(chunk, -(-k // block_k) * block_k)
    chunks = -(-k // chunk)
    assert chunk % block_k == 0 and (chunks == 1 or block_n <= 128), "two fp32 64 x N tiles a thread: N <= 128"
    ring = ring_depth(block_m, block_n, block_k, ring, chunks * (chunk // block_k))
    # the leading warpgroup issues at most a ring of blocks before the last frees a slot: each must signal within it
    assert lag * (block_m // HALF - 1) <= ring, f"lags of {lag} blocks must fit the ring's {ring} slots"
    # a consumer's registers: 232 for two (the default takes the rest); three at 160 leave the loader 24 (ptxas spills)
    return dict(HALVES=block_m // HALF, GROUP_M=8, NUM_CHUNKS=chunks, CHUNK_BLOCKS=chunk // block_k,
                NUM_BUFFERS=ring, LAG=lag, REGS=232 if block_m == 2 * HALF else 160, num_warps=4)


def linear_ws(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, chunk: int, block_m: int = 128,
              block_n: int = 128, block_k: int = 64, ring: int = 6, lag: int = 3, programs: int = 0) -> torch.Tensor:
    """`x @ w.T + bias` (bf16) under the K partition `chunk`, by the warp-specialized kernel in `block_m` (128 or
    192) x `block_n` tiles: `programs` (0: one a tile, else at most that many, each running every so-many-th tile:
    persistent)."""
    M, K = x.shape
    N = w.shape[0]
    out = x.new_empty((M, N))
    dt = gl.bfloat16
    a = TensorDescriptor.from_tensor(x, [HALF, block_k], _layout(HALF, block_k, dt))
    b = TensorDescriptor.from_tensor(w, [block_n, block_k], _layout(block_n, block_k, dt))
    c = TensorDescriptor.from_tensor(out, [HALF, block_n], _layout(HALF, block_n, dt))
    tiles = -(-M // block_m) * -(-N // block_n)
    grid = min(tiles, programs) if programs else tiles
    ws_chunked_kernel[(grid,)](a, b, c, out if bias is None else bias, M, N, HAS_BIAS=bias is not None,
                               **meta(K, chunk, block_m, block_n, block_k, ring, lag))
    return out


def compile_only(configs: list[tuple]) -> None:
    """Registers, spill bytes and shared memory of each (k, chunk, block_m, block_n, block_k, ring, lag, bias), for
    sm_90a."""
    import triton

    print(f"Triton {triton.__version__}, sm_90a: registers at launch / spill bytes / shared bytes")
    done = set()
    for k, chunk, block_m, block_n, block_k, ring, lag, bias in configs:
        m = dict(meta(k, chunk, block_m, block_n, block_k, ring, lag), HAS_BIAS=bias)
        if tuple(m.items()) + (k, block_n) in done:  # (rings past what shared memory holds come out alike)
            continue
        done.add(tuple(m.items()) + (k, block_n))
        host = torch.empty(256, k, dtype=torch.bfloat16)
        descs = [TensorDescriptor.from_tensor(host, [r, c], _layout(r, c, gl.bfloat16))
                 for r, c in ((HALF, block_k), (block_n, block_k), (HALF, block_n))]
        args = dict(zip(("a_desc", "b_desc", "c_desc"), descs), bias_ptr="*bf16", M="i32", N="i32")
        regs, spill, shared = gluon_resources(ws_chunked_kernel, args, m, m["num_warps"])
        print(f"k {k}, chunk {chunk} ({m['NUM_CHUNKS']}), {block_m} x {block_n} x {block_k}, ring {m['NUM_BUFFERS']}, "
              f"lag {lag}{', bias' if bias else ''}: {regs} / {spill} / {shared}", flush=True)


def variants(rings: list[int], lags: list[int], whole: bool) -> list[tuple[int, int, int, int]]:
    """(block_m, block_n, ring, lag) of each variant tried: 128- and 192-row tiles of 128 columns, each lag the ring
    leaves room for; where K is whole (one accumulator), 128 x 256 tiles too."""
    out = []
    for bm, bn in ((128, 128), (192, 128)) + (((128, 256),) if whole else ()):
        for ring in rings:
            depth = ring_depth(bm, bn, 64, ring, 1 << 20)
            out += [(bm, bn, depth, lag) for lag in lags if lag * (bm // HALF - 1) <= depth]
    return sorted(set(out))


def case_partitions(case: str, chunks: str, sms: int) -> list[int]:
    """The case's partitions to time: the default tuple's, or legal ones (`partition_probe.partitions`)."""
    n, k, default, _ = CASES[case]
    if chunks == "default":
        return [default]
    return partitions(case_deployment(case, sms), n, k, chunks)


def case_deployment(case: str, sms: int):
    """The deployment of the case's model (`partition_probe.deployment`: its selection's facts)."""
    return deployment("0.5b" if case.endswith("05") else "1.5b", sms, SMEM_BYTES)


def smoke(cases: list[str], lags: list[int], rings: list[int]) -> None:
    """Each variant once at M = 300 (three row tiles, the last one partial), one tile a program and persistent in
    2 programs (several tiles each), against `linear`'s bits; each printed before it runs (a hang names itself)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in cases:
        n, k, chunk, has_bias = CASES[case]
        w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
        x = torch.randn(300, k, generator=g, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if has_bias else None
        for part in sorted({chunk, k}):
            ref = linear(x, w, b, chunk=part, parallel=False, block_m=64, block_n=64, block_k=64)
            for bm, bn, ring, lag in variants(rings, lags if part < k else [0], part >= k):
                for programs in (0, 2):
                    kw = dict(chunk=part, block_m=bm, block_n=bn, ring=ring, lag=lag, programs=programs)
                    print(f"{case} {kw}: ", end="", flush=True)
                    out = linear_ws(x, w, b, **kw)
                    torch.cuda.synchronize()
                    print("=" if torch.equal(out, ref) else f"DIFF ({int((out != ref).sum())} outputs)", flush=True)


def gpu(cases: list[str], ms: list[int], lags: list[int], rings: list[int], chunks: str) -> None:

    us = lambda fn: graph_seconds(fn) * 1e6  # noqa: E731
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call (CUDA-graph replays, cold "
          f"weights)")
    print("| case | chunk | M | cuBLAS | selected | sequential 128 x 128 | K whole 128 x 128 / x 256 | "
          "warp-specialized (best) | ws / cuBLAS | bits | control differs |\n" + "|---" * 11 + "|")
    g = torch.Generator(device="cuda").manual_seed(0)
    for case, chunk in ((c, p) for c in cases for p in case_partitions(c, chunks, sms)):
        n, k, _, has_bias = CASES[case]
        select, w0, w, b, big, ref_all, whole_all = site_operands(case_deployment(case, sms), n, k, has_bias,
                                                                  chunk, max(ms), g)
        for m in ms:
            x, ref = big[:m], ref_all[:m]
            cublas, chosen, selected, same = baseline(x, w0, w, b, select, ref, us)
            seq = min((us(lambda: linear_wgmma(x, w(), b, chunk=chunk, block_m=128, block_n=128, block_k=64,
                                               num_buffers=ring, persistent=p)), ring, p)
                      for ring in (3, 4) for p in (False, True))
            same &= torch.equal(linear_wgmma(x, w0, b, chunk=chunk, block_m=128, block_n=128, block_k=64,
                                             num_buffers=4), ref)
            whole = [us(lambda: linear_wgmma(x, w(), b, chunk=k, block_m=128, block_n=bn, block_k=64,
                                             num_buffers=4 if bn == 128 else 3, persistent=True)) for bn in (128, 256)]
            # the control: another partition (K whole) where K is cut, else cuBLAS, must differ somewhere
            differs = not torch.equal(whole_all[:m] if chunk < k else F.linear(x, w0, b), ref)
            each, errors = [], []
            for bm, bn, ring, lag in variants(rings, lags if chunk < k else [0], chunk >= k):  # (K whole: no lag)
                for programs in (0, sms):
                    kw = dict(chunk=chunk, block_m=bm, block_n=bn, ring=ring, lag=lag, programs=programs)
                    try:
                        out = linear_ws(x, w0, b, **kw)
                    except Exception as e:  # noqa: BLE001 - a probe reports a variant that fails to build
                        errors.append(f"{kw}: {type(e).__name__}: {str(e)[:300]}")
                        continue
                    if not torch.equal(out, ref):
                        same = False
                        errors.append(f"{kw}: {int((out != ref).sum())} of {ref.numel()} outputs differ")
                    name = f"{bm}x{bn} r{ring} l{lag}{' P' if programs else ''}"
                    each.append((us(lambda: linear_ws(x, w(), b, **kw)), name))
            best = min(each) if each else (float("nan"), "none ran")
            print(f"| {case} | {chunk} | {m} | {cublas:.1f} | {selected:.1f} | {seq[0]:.1f} (ring {seq[1]}"
                  f"{', P' if seq[2] else ''}) | {whole[0]:.1f} / {whole[1]:.1f} | {best[0]:.1f} ({best[1]}) | "
                  f"{best[0] / cublas:.2f}x | {'=' if same else 'DIFF'} | "
                  f"{'yes' if differs else 'NO (a weak check)'} |", flush=True)
            print("    ws each (µs, tile, ring, lag, P): " + ", ".join(f"{t:.1f} {name}" for t, name in each))
            for e in errors[:3]:
                print("   ", e)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="down05,down15", help=f"some of {', '.join(CASES)}")
    ap.add_argument("--ms", default="512,1024,2048,8192")
    ap.add_argument("--lags", default="0,2,4")
    ap.add_argument("--rings", default="5,6")
    ap.add_argument("--chunks", default="default", help="'default' (the default tuple's partition), 'all' (every "
                    "legal one: bench/partition_probe.py) or a comma list of legal ones (0: K whole)")
    ap.add_argument("--compile-only", action="store_true", help="sm_90a resources of each variant; no GPU needed")
    ap.add_argument("--smoke", action="store_true", help="one call of each variant at M = 300, bits only (run it "
                    "under `timeout` first: a wrong barrier phase hangs the GPU rather than failing)")
    args = ap.parse_args()
    lags, rings = [int(v) for v in args.lags.split(",")], [int(v) for v in args.rings.split(",")]
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"gemm_ws_probe: --cases {unknown} unknown; known: {sorted(CASES)}")
    if args.compile_only:
        configs = []
        for case in cases:
            _, k, chunk, bias = CASES[case]
            for part in sorted({chunk, k}):  # the default partition, and K whole
                configs += [(k, part, bm, bn, 64, ring, lag, bias)
                            for bm, bn, ring, lag in variants(rings, lags if part < k else [0], part >= k)]
        compile_only(configs)
        return
    for case in cases:  # a bad --chunks is refused before any GPU work
        case_partitions(case, args.chunks, 132)
    if not torch.cuda.is_available():
        raise SystemExit("gemm_ws_probe: no CUDA device (an sm_90 GPU); --compile-only runs without one")
    if args.smoke:
        smoke(cases, lags, rings)
        return
    gpu(cases, [int(m) for m in args.ms.split(",")], lags, rings, args.chunks)


if __name__ == "__main__":
    main()
