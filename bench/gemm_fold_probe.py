"""Probe: the K partition's parallel form with the chunk sums folded by the tile's last unit, in one kernel.

    python3 -P bench/gemm_fold_probe.py [--cases down05,down15] [--ms 256,512,640,768,1024,2048]
    python3 -P bench/gemm_fold_probe.py --smoke        # GPU, first: bits and the counters' reset, M = 300
    python -P bench/gemm_fold_probe.py --compile-only  # any machine (Triton 3.6): sm_90a registers, spills, smem

At M = 512-640 the down projections run 1.5-1.8x cuBLAS in every legal partition and every form of the grid
(docs/BENCHMARKS.md, session 44): their 64 x 128 tiles are 28-70 on 132 SMs, so the chunks must run in parallel,
and the parallel form then pays a second kernel that reads every chunk's fp32 sum back and adds them in order. Here
each (tile, chunk) is a unit, as in `matmul_wgmma`'s parallel form, whose fp32 sum is stored to a workspace; the
unit then counts itself in at its tile (an atomic add, after a CTA barrier, with release and acquire at GPU scope),
and the unit that counts last reads the tile's other chunk sums back and adds them in chunk order (its own from
registers), then the bias, then one rounding: `linear`'s operations, so its bits, and no second launch. The last
unit resets the tile's counter, so a call leaves them zero for the next (graph replays). No unit waits on another,
so no grid size can deadlock. Units are tile-major (a tile's chunks run side by side: its fold comes early, under
other units' MMAs) or chunk-major (the programs at work share a chunk's columns of x and w).

Per case and M: cuBLAS, the selection, `matmul_wgmma`'s parallel form (kernel and combine) and its combine alone,
and each fold variant (tile, ring, programs: one unit a program or persistent, order), each output compared bit for
bit with `linear`'s; control: K whole must differ. CUDA-graph replays over cold weight copies, median µs.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as e:  # a Triton without Gluon's Hopper API
    sys.exit(f"gemm_fold_probe: needs Triton's Gluon (3.6 or later): {e}")
# a CTA-wide barrier (bar.sync): Triton 3.6 (the device's) names it thread_barrier, later releases barrier
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

from detent_rl.kernels.matmul import combine_splits, linear
from detent_rl.kernels.matmul_wgmma import SMEM_BYTES, _chunk_sums, _issue_load, _tile_offsets
from detent_rl.kernels.matmul_wgmma_plan import linear_wgmma
from detent_rl.timing import graph_seconds

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_ws_probe import CASES, case_deployment  # noqa: E402
from partition_probe import baseline, site_operands  # noqa: E402
from sm90_compile import gluon_resources  # noqa: E402

# block_m, block_n, ring, programs per SM (0: one unit a program), tile-major
VARIANTS = [(bm, bn, ring, per_sm, tm) for bm, bn, ring in ((64, 128, 4), (64, 128, 3), (128, 128, 4), (64, 64, 6))
            for per_sm in (0, 1, 2) for tm in (True, False)]


@gluon.jit
def _fold_unit(unit, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
               SPLITS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr, TILE_MAJOR: gl.constexpr):
    """Unit `unit`'s tile, first row and column, chunk and first K block."""
    if TILE_MAJOR:
        tile = unit // SPLITS
        chunk = unit % SPLITS
    else:
        tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
        chunk = unit // tiles
        tile = unit - chunk * tiles
    off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return tile, off_m, off_n, chunk, chunk * CHUNK_BLOCKS


@gluon.jit
def _fold_tile(ws_ptr, out_ptr, bias_ptr, off_m, off_n, M, N, stride_om, ws_rows, HAS_BIAS: gl.constexpr,
               SPLITS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr):
    """out[tile] = ws[0][tile] + ws[1][tile] + ... (+ bias), rounded once: 16 rows at a time in 16-byte loads (one
    loaded sum live at a time: the accumulator's layout held the tile, its sum and a loaded one, and spilled)."""
    ROWS: gl.constexpr = 16
    fold: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 * 4 // BLOCK_N, BLOCK_N // 4],
                                          warps_per_cta=[num_warps, 1], order=[1, 0])
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, fold))
    col_ok = gl.expand_dims(cols < N, 0)
    if HAS_BIAS:
        bias = gl.expand_dims(gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32), 0)
    for r in range(0, BLOCK_M, ROWS):
        rows = off_m + r + gl.arange(0, ROWS, layout=gl.SliceLayout(1, fold))
        offs = gl.expand_dims(rows, 1) * N + gl.expand_dims(cols, 0)  # (ws rows: whole tiles)
        ok = col_ok & gl.expand_dims(rows >= 0, 1)
        total = gl.load(ws_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")  # chunk 0's: no zero added first
        for c in range(1, SPLITS):
            total = total + gl.load(ws_ptr + c * ws_rows * N + offs, mask=ok, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total = total + bias
        gl.store(out_ptr + gl.expand_dims(rows, 1) * stride_om + gl.expand_dims(cols, 0),
                 total.to(out_ptr.dtype.element_ty), mask=ok & gl.expand_dims(rows < M, 1))


@gluon.jit
def fold_kernel(a_desc, b_desc, ws_ptr, out_ptr, bias_ptr, count_ptr, M, N, stride_om, ws_rows,
                HAS_BIAS: gl.constexpr, SPLITS: gl.constexpr, CHUNK_BLOCKS: gl.constexpr, GROUP_M: gl.constexpr,
                NUM_BUFFERS: gl.constexpr, TILE_MAJOR: gl.constexpr, num_warps: gl.constexpr):
    """Units program_id, program_id + num_programs, ...: one chunk of one output tile each (x rows A, w rows B),
    its fp32 sum stored to rows chunk * ws_rows + the tile's of the workspace; the tile's last unit to count in
    adds the SPLITS sums in chunk order (+ bias), stores the tile and zeroes its counter."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    pid = gl.program_id(0)
    num_units = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N) * SPLITS
    my_units = (num_units - pid + gl.num_programs(0) - 1) // gl.num_programs(0)
    num_loads = my_units * CHUNK_BLOCKS
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_BUFFERS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_BUFFERS] + b_desc.block_type.shape, b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_BUFFERS):
        mbarrier.init(bars.index(s), count=1)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    tile, off_m, off_n, chunk, k0 = _fold_unit(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M, SPLITS, CHUNK_BLOCKS,
                                               TILE_MAJOR)
    for i in gl.static_range(NUM_BUFFERS - 1):  # the ring's first blocks (NUM_BUFFERS <= CHUNK_BLOCKS + 1)
        _issue_load(i, off_m, off_n, k0 + i, a_desc, b_desc, bars, a_bufs, b_bufs, NUM_BUFFERS, i < num_loads)
    for t in range(my_units):
        next_tile, next_m, next_n, next_chunk, next_k0 = _fold_unit(pid + (t + 1) * gl.num_programs(0), M, N, BLOCK_M,
                                                                    BLOCK_N, GROUP_M, SPLITS, CHUNK_BLOCKS, TILE_MAJOR)
        acc = _chunk_sums(t * CHUNK_BLOCKS, a_desc, b_desc, off_m, off_n, k0, next_m, next_n, next_k0, num_loads,
                          bars, a_bufs, b_bufs, layout, 1, CHUNK_BLOCKS, NUM_BUFFERS)
        col_ok = gl.expand_dims(off_n + cols < N, 0) & gl.expand_dims(rows < BLOCK_M, 1)
        offs = gl.expand_dims(off_m + rows, 1) * N + gl.expand_dims(off_n + cols, 0)  # (ws rows: whole tiles)
        gl.store(ws_ptr + chunk * ws_rows * N + offs, acc, mask=col_ok)
        cta_barrier()  # every thread's stores, then one release at GPU scope (CUTLASS's barrier arrive)
        seen = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if seen == SPLITS - 1:  # the tile's last unit: every chunk sum is stored and visible
            _fold_tile(ws_ptr, out_ptr, bias_ptr, off_m, off_n, M, N, stride_om, ws_rows, HAS_BIAS, SPLITS, BLOCK_M,
                       BLOCK_N, num_warps)
            gl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")  # zero for the next call
        tile = next_tile
        off_m = next_m
        off_n = next_n
        chunk = next_chunk
        k0 = next_k0
    for s in gl.static_range(NUM_BUFFERS):
        mbarrier.invalidate(bars.index(s))


def _layout(rows: int, cols: int, dt):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dt)


def ring_depth(block_m: int, block_n: int, block_k: int, asked: int, unit_blocks: int) -> int:
    stage = (block_m + block_n) * block_k * 2
    return max(2, min(asked, (SMEM_BYTES - 1024) // stage, unit_blocks + 1))


def meta(k: int, chunk: int, block_m: int, block_k: int, ring: int, block_n: int, tile_major: bool,
         bias: bool) -> dict:
    assert chunk % block_k == 0 and chunk < k, "a cut K of whole blocks"
    return dict(HAS_BIAS=bias, SPLITS=-(-k // chunk), CHUNK_BLOCKS=chunk // block_k, GROUP_M=8,
                NUM_BUFFERS=ring_depth(block_m, block_n, block_k, ring, chunk // block_k), TILE_MAJOR=tile_major,
                num_warps=block_m // 16)


_SCRATCH: dict = {}  # (device, M, N, splits, tile) -> (workspace, counters): counters stay zero between calls


def linear_fold(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, chunk: int,
                block_m: int = 64, block_n: int = 128, block_k: int = 64, ring: int = 4, programs: int = 0,
                tile_major: bool = True) -> torch.Tensor:
    """`x @ w.T + bias` (bf16) under the K partition `chunk`: one unit a (tile, chunk), folded by the tile's last
    unit; `programs` (0: one unit a program, else at most that many, each running every so-many-th unit)."""
    M, K = x.shape
    N = w.shape[0]
    m = meta(K, chunk, block_m, block_k, ring, block_n, tile_major, bias is not None)
    tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
    key = (x.device, M, N, m["SPLITS"], block_m, block_n)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty(m["SPLITS"], tiles_m * block_m, N, device=x.device, dtype=torch.float32),
                         torch.zeros(tiles_m * tiles_n, device=x.device, dtype=torch.int32))
    ws, counts = _SCRATCH[key]
    out = x.new_empty((M, N))
    a = TensorDescriptor.from_tensor(x, [block_m, block_k], _layout(block_m, block_k, gl.bfloat16))
    b = TensorDescriptor.from_tensor(w, [block_n, block_k], _layout(block_n, block_k, gl.bfloat16))
    units = tiles_m * tiles_n * m["SPLITS"]
    grid = min(units, programs) if programs else units
    fold_kernel[(grid,)](a, b, ws, out, bias if bias is not None else out, counts, M, N, out.stride(0),
                         tiles_m * block_m, **m)
    return out


def fold_resources(case: str, block_m: int, block_n: int, ring: int, tile_major: bool) -> tuple[int, int, int]:
    """(registers, spill bytes, shared bytes) of `fold_kernel` at the case's default partition, for sm_90a."""
    n, k, chunk, bias = CASES[case]
    m = meta(k, chunk, block_m, 64, ring, block_n, tile_major, bias)
    host = torch.empty(256, k, dtype=torch.bfloat16)
    descs = [TensorDescriptor.from_tensor(host, [r, 64], _layout(r, 64, gl.bfloat16)) for r in (block_m, block_n)]
    args = dict(a_desc=descs[0], b_desc=descs[1], ws_ptr="*fp32", out_ptr="*bf16", bias_ptr="*bf16",
                count_ptr="*i32", M="i32", N="i32", stride_om="i32", ws_rows="i32")
    return gluon_resources(fold_kernel, args, m, m["num_warps"])


def compile_only(cases: list[str]) -> None:
    import triton

    print(f"Triton {triton.__version__}, sm_90a: registers at launch / spill bytes / shared bytes")
    for case in cases:
        for bm, bn, ring in sorted({v[:3] for v in VARIANTS}):
            for tm in (True, False):
                regs, spill, shared = fold_resources(case, bm, bn, ring, tm)
                print(f"{case} chunk {CASES[case][2]}: {bm} x {bn}, ring {ring}, {'tile' if tm else 'chunk'}-major: "
                      f"{regs} / {spill} / {shared}", flush=True)


def smoke(cases: list[str]) -> None:
    """Each variant at M = 300 (the last row tile partial) three calls running, against `linear`'s bits: a
    counter left non-zero would skip or repeat a fold on the next call."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in cases:
        n, k, chunk, has_bias = CASES[case]
        w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
        b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if has_bias else None
        for bm, bn, ring, per_sm, tm in VARIANTS:
            kw = dict(chunk=chunk, block_m=bm, block_n=bn, ring=ring, programs=per_sm * 7, tile_major=tm)
            print(f"{case} {kw}: ", end="", flush=True)
            verdicts = []
            for _ in range(3):
                x = torch.randn(300, k, generator=g, device="cuda").to(torch.bfloat16)
                ref = linear(x, w, b, chunk=chunk, parallel=False, block_m=64, block_n=64, block_k=64)
                out = linear_fold(x, w, b, **kw)
                torch.cuda.synchronize()
                verdicts.append("=" if torch.equal(out, ref) else f"DIFF ({int((out != ref).sum())} outputs)")
            print(" ".join(verdicts), flush=True)


def gpu(cases: list[str], ms: list[int]) -> None:
    us = lambda fn: graph_seconds(fn) * 1e6  # noqa: E731
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call (CUDA-graph replays, cold "
          f"weights)")
    print("| case | chunk | M | cuBLAS | selected (form) | parallel 128 x 128 P: all / combine | fold (best) | "
          "fold / cuBLAS | bits | control differs |\n" + "|---" * 10 + "|")
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in cases:
        n, k, chunk, has_bias = CASES[case]
        select, w0, w, b, big, ref_all, whole_all = site_operands(case_deployment(case, sms), n, k, has_bias,
                                                                  chunk, max(ms), g)
        for m in ms:
            x, ref = big[:m], ref_all[:m]
            cublas, chosen, selected, same = baseline(x, w0, w, b, select, ref, us)
            par = dict(chunk=chunk, block_m=128, block_n=128, block_k=64, num_buffers=4, persistent=True, split=True)
            same &= torch.equal(linear_wgmma(x, w0, b, **par), ref)
            par_all = us(lambda: linear_wgmma(x, w(), b, **par))
            ws = torch.randn(-(-k // chunk), -(-m // 128) * 128, n, device="cuda", generator=g)
            out = x.new_empty((m, n))
            comb = us(lambda: combine_splits(ws, b, out))
            differs = not torch.equal(whole_all[:m], ref)  # the control: K whole is another partition's bits
            each, errors = [], []
            for bm, bn, ring, per_sm, tm in VARIANTS:
                kw = dict(chunk=chunk, block_m=bm, block_n=bn, ring=ring, programs=per_sm * sms, tile_major=tm)
                units = -(-m // bm) * -(-n // bn) * -(-k // chunk)
                if per_sm and units <= per_sm * sms:
                    continue  # (the same launch as one unit a program)
                try:
                    got = linear_fold(x, w0, b, **kw)
                    again = linear_fold(x, w0, b, **kw)
                except Exception as e:  # noqa: BLE001 - a probe reports a variant that fails to build
                    errors.append(f"{kw}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                for o in (got, again):
                    if not torch.equal(o, ref):
                        same = False
                        errors.append(f"{kw}: {int((o != ref).sum())} of {ref.numel()} outputs differ")
                name = f"{bm}x{bn} r{ring}{f' P{per_sm}' if per_sm else ''} {'T' if tm else 'C'}"
                each.append((us(lambda: linear_fold(x, w(), b, **kw)), name))
            best = min(each) if each else (float("nan"), "none ran")
            label = ("P" if chosen["parallel"] else "S") + ("w" if chosen.get("wgmma") else "") + \
                f"{chosen['block_m']}x{chosen['block_n']}{'P' if chosen.get('persistent') else ''}"
            print(f"| {case} | {chunk} | {m} | {cublas:.1f} | {selected:.1f} ({label}, {selected / cublas:.2f}x) | "
                  f"{par_all:.1f} / {comb:.1f} | {best[0]:.1f} ({best[1]}) | {best[0] / cublas:.2f}x | "
                  f"{'=' if same else 'DIFF'} | {'yes' if differs else 'NO (a weak check)'} |", flush=True)
            print("    fold each (µs, tile, ring, programs a SM, T/C-major): " +
                  ", ".join(f"{t:.1f} {name}" for t, name in each))
            for e in errors[:3]:
                print("   ", e)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="down05,down15", help="cut sites of gemm_ws_probe.CASES (down05, down15)")
    ap.add_argument("--ms", default="256,512,640,768,1024,2048")
    ap.add_argument("--compile-only", action="store_true", help="sm_90a resources of each variant; no GPU needed")
    ap.add_argument("--smoke", action="store_true", help="three calls of each variant at M = 300, bits only")
    args = ap.parse_args()
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES or CASES[c][2] >= CASES[c][1]]
    if bad:
        raise SystemExit(f"gemm_fold_probe: --cases {bad}: not a cut site of {sorted(CASES)}")
    if args.compile_only:
        compile_only(cases)
        return
    if not torch.cuda.is_available():
        raise SystemExit("gemm_fold_probe: no CUDA device (an sm_90 GPU); --compile-only runs without one")
    if args.smoke:
        smoke(cases)
        return
    gpu(cases, [int(m) for m in args.ms.split(",")])


if __name__ == "__main__":
    main()
