"""Probe: the K-partition linear's sequential form as hand-issued warpgroup MMAs (Gluon) vs cuBLAS.

    python3 -P bench/gemm_wgmma_probe.py [--ms 128,256,512,2048,8192] [--cases down05,down15,...] [--no-triton]

For each site and M: cuBLAS, `linear`'s best sequential and parallel schedules (the plain Triton
kernel), and `matmul_wgmma_plan.linear_wgmma` at each tile / BLOCK_K / ring depth, swapped (`swap_ab`: x's rows
in the MMA's N slot) at M <= 128, and where K is cut the parallel form (`split`: each tile's chunks in their
own programs, fp32 sums added in order after; `S`), each also persistent (`persistent`: as many programs as
the SMs hold, a few units each; `P` in the listing) where its units outnumber the SMs, every output compared bit for
bit with `linear`'s of the same partition (sequential and parallel forms). Times: CUDA-graph replays
over cold weight copies (`timing.cold_copies`), median us.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.testing

from detent_rl.kernels.matmul import linear
from detent_rl.kernels.matmul_wgmma import applies, tile_fits
from detent_rl.kernels.matmul_wgmma_plan import linear_wgmma
from detent_rl.timing import cold_copies

CASES = {  # n, k, bias, chunk (the default tuple's partition)
    "down05": (896, 4864, False, 640), "down15": (1536, 8960, False, 1792),
    "qkv05": (1152, 896, True, 896), "o05": (896, 896, False, 896), "gate_up05": (9728, 896, False, 896),
    "qkv15": (2048, 1536, True, 1536), "gate_up15": (17920, 1536, False, 1536), "o15": (1536, 1536, False, 1536),
    "lm05": (151936, 896, False, 896),
}
SEQ = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 32, 8, 3), (64, 128, 64, 4, 3), (64, 64, 64, 4, 3)]
PAR = [(16, 64, 64, 4, 3), (32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3)]
SMALL = [(16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (32, 64, 64, 4, 4)]  # the 32 bucket's Triton tiles (M <= 64)
# block_m, block_n, block_k, ring buffers, swap_ab (tile_fits filters); the swapped tiles only at M <= SWAP_M
WGMMA = [(128, 128, 64, 4, False), (128, 128, 128, 3, False), (64, 64, 64, 4, False), (64, 64, 64, 6, False),
         (64, 128, 64, 4, False), (64, 128, 64, 6, False), (128, 64, 64, 4, False), (64, 256, 64, 3, False),
         (128, 256, 64, 3, False),
         (16, 64, 64, 6, True), (32, 64, 64, 6, True), (32, 64, 64, 8, True), (64, 64, 64, 6, True),
         (16, 128, 64, 4, True), (32, 128, 64, 4, True), (64, 128, 64, 4, True)]
SWAP_M = 128
# the parallel form (`split`: one (tile, chunk) a unit, fp32 sums to a workspace) where K is cut: bm, bn, bk, ring
SPLIT = [(64, 64, 64, 4), (64, 64, 64, 6), (64, 128, 64, 4), (128, 64, 64, 4), (128, 128, 64, 3), (128, 128, 64, 4),
         (128, 256, 64, 3)]


def timed(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="512,2048,8192")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-triton", action="store_true", help="skip timing the plain Triton kernel's tiles")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; us per call")
    print("| site | M | cuBLAS | linear seq (best) | linear par (best) | wgmma (best: bk, ring) | wgmma / cuBLAS | "
          "best linear / cuBLAS | bits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        n, k, has_bias, chunk = CASES[case]
        w0 = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
        w = cold_copies(w0)
        b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if has_bias else None
        big = torch.randn(max(int(m) for m in args.ms.split(",")), k, generator=g, device="cuda").to(torch.bfloat16)
        for m in (int(m) for m in args.ms.split(",")):
            x = big[:m]
            assert applies(x, w0, 64), "not an sm_90 GPU with Gluon"
            cublas = timed(lambda: F.linear(x, w(), b))
            ref = linear(x, w0, b, chunk=chunk, parallel=False, block_m=64, block_n=64, block_k=64)
            par_ref = linear(x, w0, b, chunk=chunk, parallel=True, block_m=16, block_n=64, block_k=64)
            small = SMALL if m <= 64 and not args.no_triton else []
            seq = min((timed(lambda: linear(x, w(), b, chunk=chunk, parallel=False, block_m=bm, block_n=bn,
                                            block_k=bk, num_warps=wp, num_stages=st)), (bm, bn, bk, wp, st))
                      for bm, bn, bk, wp, st in (SEQ[:1] if args.no_triton else SEQ) + small if chunk % bk == 0)
            par = min((timed(lambda: linear(x, w(), b, chunk=chunk, parallel=True, block_m=bm, block_n=bn,
                                            block_k=bk, num_warps=wp, num_stages=st)), (bm, bn, bk, wp, st))
                      for bm, bn, bk, wp, st in (PAR[:1] if args.no_triton else PAR) + small
                      if chunk % bk == 0) if chunk < k else (float("inf"), None)
            best, same, errors, each = (float("inf"), None), True, [], []
            split = [(bm, bn, bk, ring, False, True) for bm, bn, bk, ring in SPLIT] if chunk < k else []
            for (bm, bn, bk, ring, swap, sp), pers in itertools.product(
                    [row + (False,) for row in WGMMA] + split, (False, True)):
                if chunk % bk or not tile_fits(bm, bn, chunk < k and not sp, swap) or (swap and m > SWAP_M):
                    continue
                units = triton.cdiv(m, bm) * triton.cdiv(n, bn) * (triton.cdiv(k, chunk) if sp else 1)
                if pers and units <= sms:  # one wave: the same launch
                    continue
                kw = dict(chunk=chunk, block_k=bk, num_buffers=ring, block_m=bm, block_n=bn, swap_ab=swap,
                          persistent=pers, split=sp)
                name = (bm, bn, bk, ring, ("swap" if swap else "") + ("S" if sp else "") + ("P" if pers else ""))
                try:
                    out = linear_wgmma(x, w0, b, **kw)
                except Exception as e:  # noqa: BLE001 - a probe reports what does not compile or launch
                    errors.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                if not (torch.equal(out, ref) and torch.equal(out, par_ref)):
                    same = False
                    worst = float((out.float() - ref.float()).abs().max())
                    errors.append(f"{name}: {int((out != ref).sum())} of {ref.numel()} outputs "
                                  f"differ from linear's; max |diff| {worst:.3g}")
                each.append((timed(lambda: linear_wgmma(x, w(), b, **kw)), name))
                best = min(best, each[-1])
            lin = min(seq[0], par[0])
            print(f"| {case} | {m} | {cublas:.1f} | {seq[0]:.1f} {seq[1]} | {par[0]:.1f} {par[1] or ''} | "
                  f"{best[0]:.1f} {best[1]} | {best[0] / cublas:.2f}x | {lin / cublas:.2f}x | "
                  f"{'=' if same else 'DIFF'} |", flush=True)
            print("    wgmma each (bm, bn, bk, ring, swap/P): " + ", ".join(f"{c} {t:.1f}" for t, c in each))
            for e in errors[:3]:
                print("   ", e)


if __name__ == "__main__":
    main()
