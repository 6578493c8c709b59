"""Probe: the sequential K-partition GEMM on the H200 with TMA loads, against cuBLAS and our kernel.

    python3 -P bench/gemm_tma_probe.py [--ms 256,2048,8192] [--cases down05,down15,qkv05,o05,gate_up05]

The pinned partition's large-M form (`linear(parallel=False)`, K cut into chunks, each chunk summed
from a fresh fp32 accumulator, the chunk sums added in order) ran 1.7-2.9x cuBLAS at M >= 2,048 on
the down projections while the same kernel with K whole ran ~1.05x. This probe asks whether the
loads are what costs: the same arithmetic with tensor-memory-accelerator (TMA) descriptor loads,
in three loop forms (chunks as static loops with a pipelined inner loop; one flat pipelined loop
that folds at chunk ends; a persistent grid over the first form), every output compared bit for bit
with `linear`'s (the same partition). Times: CUDA-graph replays over cold weight copies, median us.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

from detent_rl.kernels.matmul import linear, tile_ids
from detent_rl.timing import cold_copies


@triton.jit
def _chunks_tile(a_desc, b_desc, off_m, off_n, NUM_CHUNKS: tl.constexpr, CHUNK_BLOCKS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 FLAT: tl.constexpr):
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FLAT:
        total = zero
        acc = zero
        for kb in tl.range(0, NUM_CHUNKS * CHUNK_BLOCKS, num_stages=STAGES):
            a = a_desc.load([off_m, kb * BLOCK_K])
            b = b_desc.load([off_n, kb * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
            if kb % CHUNK_BLOCKS == CHUNK_BLOCKS - 1:
                if kb == CHUNK_BLOCKS - 1:
                    total = acc
                else:
                    total += acc
                acc = zero
    else:
        total = zero
        for c in tl.static_range(NUM_CHUNKS):
            acc = zero
            for kb in tl.range(0, CHUNK_BLOCKS, num_stages=STAGES):
                a = a_desc.load([off_m, (c * CHUNK_BLOCKS + kb) * BLOCK_K])
                b = b_desc.load([off_n, (c * CHUNK_BLOCKS + kb) * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            if c == 0:
                total = acc
            else:
                total += acc
    return total


@triton.jit
def _tma_kernel(a_desc, b_desc, bias_ptr, out_ptr, M, N, stride_om, HAS_BIAS: tl.constexpr,
                NUM_CHUNKS: tl.constexpr, CHUNK_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
                FLAT: tl.constexpr, PERSIST: tl.constexpr, NUM_SMS: tl.constexpr):
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    step = NUM_SMS if PERSIST else tiles  # a persistent program walks tiles NUM_SMS apart; else one tile
    for tile_id in range(tl.program_id(0), tiles, step):
        pid_m, pid_n = tile_ids(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m, off_n = pid_m * BLOCK_M, pid_n * BLOCK_N
        total = _chunks_tile(a_desc, b_desc, off_m, off_n, NUM_CHUNKS, CHUNK_BLOCKS, BLOCK_M, BLOCK_N,
                             BLOCK_K, STAGES, FLAT)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], total.to(out_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


NUM_SMS = 132


def tma_linear(x, w, bias, chunk, bm, bn, bk, warps, stages, flat=False, persist=False, group_m=8):
    M, K = x.shape
    N = w.shape[0]
    chunk = min(chunk, -(-K // bk) * bk)
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    grid = (min(tiles, NUM_SMS) if persist else tiles,)
    _tma_kernel[grid](a_desc, b_desc, bias if bias is not None else out, out, M, N, out.stride(0),
                      HAS_BIAS=bias is not None, NUM_CHUNKS=triton.cdiv(K, chunk), CHUNK_BLOCKS=chunk // bk,
                      BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, STAGES=stages, FLAT=flat,
                      PERSIST=persist, NUM_SMS=NUM_SMS, num_warps=warps)
    return out


CASES = {  # n, k, bias, chunk
    "down05": (896, 4864, False, 640), "down15": (1536, 8960, False, 1792),
    "qkv05": (1152, 896, True, 896), "o05": (896, 896, False, 896), "gate_up05": (9728, 896, False, 896),
}
TILES = [(128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
         (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 8, 3), (64, 256, 64, 4, 4)]
OURS = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 32, 8, 3), (64, 128, 64, 4, 3)]


def timed(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="256,2048,8192")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--forms", default="seq,flat,persist,whole")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; us per call")
    print("| case | M | cuBLAS | ours (best) | form | best TMA tile | TMA us | TMA / cuBLAS | ours / cuBLAS | bits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        n, k, has_bias, chunk = CASES[case]
        w0 = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
        w = cold_copies(w0)
        b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if has_bias else None
        big = torch.randn(max(int(m) for m in args.ms.split(",")), k, generator=g, device="cuda").to(torch.bfloat16)
        for m in (int(m) for m in args.ms.split(",")):
            x = big[:m]
            cublas = timed(lambda: F.linear(x, w(), b))
            ref = linear(x, w0, b, chunk=chunk, parallel=False, block_m=64, block_n=64, block_k=64)
            ours = min((timed(lambda: linear(x, w(), b, chunk=chunk, parallel=False, block_m=bm, block_n=bn,
                                             block_k=bk, num_warps=wp, num_stages=st)), (bm, bn, bk, wp, st))
                       for bm, bn, bk, wp, st in OURS)
            forms = args.forms.split(",")
            for form in forms:
                if form in ("whole", "flat") and chunk >= k:
                    continue  # one chunk: the same loop as "seq"
                c = k if form == "whole" else chunk
                cref = ref if form != "whole" else linear(x, w0, b, chunk=k, parallel=False, block_m=64,
                                                          block_n=64, block_k=64)
                best, ok, errors = (float("inf"), None), True, []
                for tile in TILES:
                    bm, bn, bk, wp, st = tile
                    kw = dict(flat=form == "flat", persist=form == "persist")
                    try:
                        out = tma_linear(x, w0, b, c, bm, bn, bk, wp, st, **kw)
                    except Exception as e:  # noqa: BLE001 - a probe reports what does not compile
                        errors.append(f"{tile}: {type(e).__name__}: {str(e)[:120]}")
                        continue
                    if not torch.equal(out, cref):
                        ok = False
                    best = min(best, (timed(lambda: tma_linear(x, w(), b, c, bm, bn, bk, wp, st, **kw)), tile))
                print(f"| {case} | {m} | {cublas:.1f} | {ours[0]:.1f} {ours[1]} | {form} | {best[1]} | "
                      f"{best[0]:.1f} | {best[0] / cublas:.2f}x | {ours[0] / cublas:.2f}x | "
                      f"{'=' if ok else 'DIFF'} |", flush=True)
                for e in errors[:2]:
                    print("   ", e)


if __name__ == "__main__":
    main()
