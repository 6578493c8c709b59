"""The K-partition linear's sequential form on Hopper, issued by hand: warpgroup MMAs in Gluon.

`matmul.linear`'s bits are fixed by its K partition: K cut into `chunk`-element chunks, each chunk's
products summed into a fresh fp32 accumulator, the chunk sums added in chunk order, then the bias,
then one rounding. In plain Triton the large-M (sequential) form of that partition runs 1.5-1.9x
cuBLAS on the down projections (docs/BENCHMARKS.md, "The chunked partition at large M"): reading
the accumulator at a chunk's end makes Triton's software pipeline wait for every MMA after every
block, not once a chunk. Here the pipeline is written out (the Gluon tutorials' TMA ring): the
operand blocks stream through a ring of shared-memory buffers that TMA fills a few blocks ahead,
a chunk's MMAs are issued back to back (each onto the accumulator of the one in flight, at most two
outstanding), and only a chunk's end waits for its MMAs: one register add (total += chunk sum), then
the next chunk's first MMA starts from zero (`use_acc=False`). The arithmetic is the partition's,
so a row equals `linear`'s bit for bit at any M (tests/test_kernels_matmul_gpu.py holds it to that
on every site).

Tiles of 64 or 128 rows (a warpgroup, 4 warps, per 64) and 64-256 columns, or, swapped (`swap_ab`: the
MMA computes the tile transposed, w's rows as its 64-row side), 16-64 rows of a decode batch by 64 or 128
columns; the fp32 accumulators stay in registers: two (the running total and the chunk's) where K is cut
into chunks — at most 128 columns — and one where K is whole. sm_90 only; the caller checks `applies`
and `tile_fits`.

The partition's parallel form runs here too (`split`): each (tile, chunk) is a unit of work whose one
accumulator's fp32 sum TMA stores to a workspace, and `matmul.combine_splits` adds the chunk sums in
order, as after the Triton kernel's parallel form: the same operations again. A persistent program runs
its units in turn, chunk-major, the ring running on from one unit's K blocks into the next one's.

The host side, `linear_wgmma` and its per-call-shape plans, is `matmul_wgmma_plan.py`.
"""
from __future__ import annotations

import functools
from typing import Any

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    HAS_GLUON = True
    # TMA's copies by either name: Triton 3.6 (the device's) has only async_copy_global_to_shared and
    # async_copy_shared_to_global; later Gluon renamed them async_load and async_store (the old names raise)
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
except (ImportError, AttributeError):  # no Triton, or one without Gluon's Hopper API (or TMA copies by either name)
    HAS_GLUON = False


if HAS_GLUON:
    @gluon.jit
    def _tile_ids(pid, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
        """The same grouped tile order as `matmul.tile_ids` (GROUP_M row tiles a group: L2 reuse)."""
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        group = GROUP_M * num_pid_n
        first_m = (pid // group) * GROUP_M
        size_m = min(num_pid_m - first_m, GROUP_M)
        return first_m + (pid % group) % size_m, (pid % group) // size_m

    @gluon.jit
    def _tile_offsets(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
        """Tile `tile`'s first row and column (`_tile_ids`)."""
        pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        return pid_m * BLOCK_M, pid_n * BLOCK_N

    @gluon.jit
    def _unit_offsets(unit, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                      SPLITS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr):
        """Work unit `unit`'s first row and column, its chunk and its first K block. With SPLITS = 1 a unit is a
        tile (all of K); else one chunk of a tile, chunk-major (the programs at work together share a chunk's
        columns of x and of w)."""
        if SPLITS == 1:
            chunk = unit * 0
        else:
            chunk = unit // (gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N))
        off_m, off_n = _tile_offsets(unit - chunk * (gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)), M, N, BLOCK_M,
                                     BLOCK_N, GROUP_M)
        return off_m, off_n, chunk, chunk * CHUNK_BLOCKS

    @gluon.jit
    def _issue_load(i, off_m, off_n, kb, a_desc, b_desc, bars, a_bufs, b_bufs, NUM_BUFFERS: gl.constexpr, pred):
        """TMA copies of K block `kb` of the tile at (off_m, off_n), the x rows and the w rows, into ring slot
        i % NUM_BUFFERS (`i`: the blocks the program loaded before this one)."""
        slot = i % NUM_BUFFERS
        bar = bars.index(slot)
        k = kb * a_desc.block_type.shape[1]
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        tma_load(a_desc, [off_m, k], bar, a_bufs.index(slot), pred)
        tma_load(b_desc, [off_n, k], bar, b_bufs.index(slot), pred)

    @gluon.jit
    def _block_mma(i, acc, use_acc, bars, a_bufs, b_bufs, NUM_BUFFERS: gl.constexpr):
        """Wait for K block i's operands, then issue its MMA onto `acc` (asynchronously)."""
        slot = i % NUM_BUFFERS
        mbarrier.wait(bars.index(slot), (i // NUM_BUFFERS) & 1)
        return warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), acc, use_acc=use_acc,
                             is_async=True)

    @gluon.jit
    def _mma_and_refill(i, j, acc, use_acc, a_desc, b_desc, off_m, off_n, k0, next_m, next_n, next_k0, num_loads,
                        bars, a_bufs, b_bufs, NUM_BUFFERS: gl.constexpr, NUM_K: gl.constexpr):
        """Issue the program's K block i (block j of its unit: a tile, or one chunk of a tile, whose K blocks
        start at block k0) onto the MMA in flight (the hardware keeps their order), wait until at most it is
        outstanding (block i - 1's MMA is done: its slot is free), and load the block that slot takes: block
        j + NUM_BUFFERS - 1 of this unit or, past its end, of the program's next unit at (next_m, next_n,
        next_k0) (the ring runs on from one unit into the next; NUM_BUFFERS <= NUM_K + 1 keeps it within that
        one), while the program has blocks left (`num_loads` in all)."""
        acc = _block_mma(i, acc, use_acc, bars, a_bufs, b_bufs, NUM_BUFFERS)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        kb = j + NUM_BUFFERS - 1
        here = (kb < NUM_K).to(gl.int32)
        kb_next = next_k0 + kb - NUM_K
        _issue_load(i + NUM_BUFFERS - 1, next_m + here * (off_m - next_m), next_n + here * (off_n - next_n),
                    kb_next + here * (k0 + kb - kb_next), a_desc, b_desc, bars, a_bufs, b_bufs, NUM_BUFFERS,
                    i + NUM_BUFFERS - 1 < num_loads)
        return acc

    @gluon.jit
    def _chunk_sums(base, a_desc, b_desc, off_m, off_n, k0, next_m, next_n, next_k0, num_loads, bars, a_bufs, b_bufs,
                    layout: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr,
                    NUM_BUFFERS: gl.constexpr):
        """One unit's chunk sums added in chunk order; its K blocks (from block k0) are the program's blocks
        `base` on. One accumulator serves every chunk: a chunk's end waits for its MMAs before the next chunk's
        first one overwrites it. (Two chunk accumulators in turn, to overlap that wait, need a third 128 x 128
        fp32 tile in registers: measured, it spilled and ran 3-4x slower.)"""
        NUM_K: gl.constexpr = NUM_CHUNKS * CHUNK_BLOCKS
        shape: gl.constexpr = (a_desc.block_type.shape[0], b_desc.block_type.shape[0])
        acc = gl.zeros(shape, dtype=gl.float32, layout=layout)
        if NUM_CHUNKS == 1:  # K whole, or one chunk a unit: one accumulator, no running total held beside it
            for i in range(NUM_K):
                acc = _mma_and_refill(base + i, i, acc, i != 0, a_desc, b_desc, off_m, off_n, k0, next_m, next_n,
                                      next_k0, num_loads, bars, a_bufs, b_bufs, NUM_BUFFERS, NUM_K)
            return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        total = acc
        for i in range(NUM_K):
            j = i % CHUNK_BLOCKS
            if (j == 0) & (i > 0):  # the previous chunk is issued: wait for its sum, fold it in chunk order
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                if i == CHUNK_BLOCKS:
                    total = acc
                else:
                    total = total + acc
            acc = _mma_and_refill(base + i, i, acc, j != 0, a_desc, b_desc, off_m, off_n, k0, next_m, next_n,
                                  next_k0, num_loads, bars, a_bufs, b_bufs, NUM_BUFFERS, NUM_K)  # a chunk from zero
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        return total + acc

    @gluon.jit
    def _store_swapped(total, off_m, off_n, out_ptr, bias_ptr, M, N, stride_om, HAS_BIAS: gl.constexpr,
                       layout: gl.constexpr, num_warps: gl.constexpr):
        """A swapped tile: total[i, j] is out[off_n + j, off_m + i]; the bias runs down the rows, the store
        is transposed (from registers)."""
        BLOCK_M: gl.constexpr = total.shape[0]
        BLOCK_N: gl.constexpr = total.shape[1]
        if HAS_BIAS:
            offs_b = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
            bias = gl.load(bias_ptr + offs_b, mask=offs_b < M, other=0.0).to(gl.float32)
            total = total + gl.expand_dims(bias, 1)
        # a warp's lanes on 32 consecutive output columns (one output row each store)
        store: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                               warps_per_cta=[BLOCK_M // 32, num_warps // (BLOCK_M // 32)],
                                               order=[0, 1])
        vals = gl.convert_layout(total.to(out_ptr.dtype.element_ty), store)
        cols = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, store))
        rows = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, store))
        ptrs = out_ptr + gl.expand_dims(rows, 0) * stride_om + gl.expand_dims(cols, 1)
        gl.store(ptrs, vals, mask=(gl.expand_dims(cols, 1) < M) & (gl.expand_dims(rows, 0) < N))

    @gluon.jit
    def _chunked_wgmma_kernel(a_desc, b_desc, c_desc, out_ptr, bias_ptr, M, N, stride_om, ws_rows,
                              HAS_BIAS: gl.constexpr, NUM_CHUNKS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr,
                              GROUP_M: gl.constexpr, NUM_BUFFERS: gl.constexpr, SWAP: gl.constexpr,
                              SPLITS: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr):
        """Work units program_id, program_id + num_programs, ... (one unit a program, or, persistent, a few in
        turn, the ring running on across them): acc = A rows x B rows^T. A is x and B is w; with SWAP, A is w
        and B is x (M and N are then the output's N and M), so a few x rows ride in the MMA's N slot (8-256)
        instead of filling most of a 64-row one, and the tile is stored transposed. A unit is an output tile
        (its NUM_CHUNKS chunk sums added in order), or with SPLITS > 1 (the parallel form) one chunk of one:
        its fp32 sum is stored to rows chunk * ws_rows + the tile's rows of the workspace `c_desc` describes,
        which `matmul.combine_splits` adds in chunk order."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        NUM_K: gl.constexpr = NUM_CHUNKS * CHUNK_BLOCKS  # a unit's K blocks; every chunk whole: past K, TMA reads 0
        if PDL:  # matmul's pdl_enter: wait for the predecessor, release the successor
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                      pack=1)
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        pid = gl.program_id(0)
        num_units = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N) * SPLITS
        my_units = (num_units - pid + gl.num_programs(0) - 1) // gl.num_programs(0)
        num_loads = my_units * NUM_K

        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(NUM_BUFFERS):
            mbarrier.init(bars.index(s), count=1)
        if not SWAP:  # the tile's TMA store buffer; a tile's store runs on under the next unit's MMAs
            c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)

        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
        off_m, off_n, chunk, k0 = _unit_offsets(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M, SPLITS, CHUNK_BLOCKS)
        for i in gl.static_range(NUM_BUFFERS - 1):  # the ring's first blocks (NUM_BUFFERS <= NUM_K + 1)
            _issue_load(i, off_m, off_n, k0 + i, a_desc, b_desc, bars, a_bufs, b_bufs, NUM_BUFFERS, i < num_loads)
        for t in range(my_units):
            # the program's next unit (past its last one the loads are predicated off)
            next_m, next_n, next_chunk, next_k0 = _unit_offsets(pid + (t + 1) * gl.num_programs(0), M, N, BLOCK_M,
                                                                BLOCK_N, GROUP_M, SPLITS, CHUNK_BLOCKS)
            total = _chunk_sums(t * NUM_K, a_desc, b_desc, off_m, off_n, k0, next_m, next_n, next_k0, num_loads,
                                bars, a_bufs, b_bufs, layout, NUM_CHUNKS, CHUNK_BLOCKS, NUM_BUFFERS)
            if SWAP:
                _store_swapped(total, off_m, off_n, out_ptr, bias_ptr, M, N, stride_om, HAS_BIAS, layout, num_warps)
            else:
                if HAS_BIAS:
                    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
                    bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
                    total = total + gl.expand_dims(bias, 0)
                tma.store_wait(pendings=0)  # the previous tile's store has read the buffer
                c_smem.store(total.to(c_desc.dtype))
                fence_async_shared()
                # rows past M are clipped (a chunk's slice of the workspace is whole tiles: ws_rows)
                tma_store(c_desc, [chunk * ws_rows + off_m, off_n], c_smem)
            off_m = next_m
            off_n = next_n
            chunk = next_chunk
            k0 = next_k0
        if not SWAP:
            tma.store_wait(pendings=0)
        for s in gl.static_range(NUM_BUFFERS):
            mbarrier.invalidate(bars.index(s))


SMEM_BYTES = 227 * 1024  # an sm_90 CTA's shared memory
MAX_ACC_REGS = 128  # fp32 accumulator registers a thread may hold (two tiles when K is cut into chunks)


def tile_fits(block_m: int, block_n: int, chunked: bool, swap_ab: bool = False) -> bool:
    """Whether a `block_m` x `block_n` output tile is one this kernel runs: one warpgroup (4 warps) per 64
    rows of the MMA's A operand, a wgmma N of 64-256, and its accumulators in registers — one tile when K
    is whole, two (the chunk's and the running total) when K is cut: 128 x 128 with 8 warps holds two,
    128 x 256 only one. With `swap_ab` the A operand is w's `block_n` rows (64 or 128) and x's `block_m`
    rows (16-64) are the MMA's N."""
    if swap_ab:
        block_m, block_n = block_n, block_m
        if block_m not in (64, 128) or block_n not in (16, 32, 64):
            return False
    elif block_m not in (64, 128) or block_n not in (64, 128, 256):
        return False
    # a BM x BN fp32 tile over BM / 16 warps of 32 threads: BN / 2 registers a thread
    return block_n // 2 * (2 if chunked else 1) <= MAX_ACC_REGS


def applies(x: Any, w: Any, block_k: int) -> bool:
    """Whether `linear_wgmma` can run this call: Hopper (sm_90), 16-bit operands, TMA-legal strides
    (rows 16-byte aligned, last dimension contiguous)."""
    import torch

    if not (HAS_GLUON and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if not _is_sm90(x.device):
        return False
    K = x.shape[1]
    return (x.stride(1) == 1 and w.stride(1) == 1 and (x.stride(0) * 2) % 16 == 0 and (w.stride(0) * 2) % 16 == 0
            and (K * 2) % 16 == 0 and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0 and block_k in (32, 64, 128))


@functools.lru_cache(maxsize=None)
def _is_sm90(device: Any) -> bool:
    import torch

    return torch.cuda.get_device_capability(device) == (9, 0)
