"""Compile `linear`'s Triton kernel and the gated MLP kernel for sm_90a without a GPU: registers, spill bytes and
shared memory per tile, from ptxas (the one Triton ships).

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/sm90_compile.py [--tiles 16x64x128x4x4,64x128x64x4x3]
        [--chunk 896]

A CPU-only check of a kernel variant's resources before device time is spent on it: the arguments are specialised
as Triton's launcher specialises them at a call (pointers, and sizes and strides that are multiples of 16, marked
divisible by 16; unit strides constant), or the figures are not the device's. Use the device's Triton for the
device's figures (a side environment: `pip install torch==2.13.0 triton==3.6.0`); another version prints its own.
A tile is BLOCK_M x BLOCK_N x BLOCK_K x warps x stages, the gated kernel taking half its columns (as it runs the
selection's tile).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from detent_rl.kernels.matmul import _matmul_kernel
from detent_rl.kernels.matmul_gated import _gate_up_silu_kernel

TILES = "16x64x128x4x4,16x32x128x4x4,32x64x64x4x4,64x64x64x4x4,64x128x64x4x3"
BF16 = "*bf16"
LINEAR_ARGS = dict(x_ptr=BF16, w_ptr=BF16, b_ptr=BF16, out_ptr=BF16, ws_ptr="*fp32", M="i32", N="i32:16",
                   K="i32:16", num_chunks="i32", stride_xm="i32:16", stride_xk="i32:1", stride_wn="i32:16",
                   stride_wk="i32:1", stride_om="i32:16", stride_on="i32:1")
GATED_ARGS = dict(x_ptr=BF16, w_ptr=BF16, b_ptr=BF16, out_ptr=BF16, M="i32", D="i32:16", K="i32:16",
                  num_chunks="i32", stride_xm="i32:16", stride_xk="i32:1", stride_wn="i32:16", stride_wk="i32:1",
                  stride_om="i32:16", stride_on="i32:1")


def resources(fn, args: dict[str, str], consts: dict, warps: int, stages: int) -> tuple[int, int, int]:
    """(registers, spill-store bytes, shared-memory bytes) of `fn` compiled for sm_90a. `args`: name -> Triton
    type, `i32:16` an int divisible by 16, `i32:1` one fixed at 1 (a unit stride); pointers are 16-byte aligned."""
    signature, attrs, constexprs = {}, {}, {}
    assert set(fn.arg_names) == set(args) | set(consts), set(fn.arg_names) ^ (set(args) | set(consts))
    for i, name in enumerate(fn.arg_names):  # in the kernel's own parameter order
        kind = args.get(name)
        if kind is None:
            signature[name], constexprs[(i,)] = "constexpr", consts[name]
        elif kind == "i32:1":
            signature[name], constexprs[(i,)] = "constexpr", 1
        elif kind.endswith(":16") or kind.startswith("*"):
            signature[name], attrs[(i,)] = kind.removesuffix(":16"), [["tt.divisibility", 16]]
        else:
            signature[name] = kind
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    return ptxas_resources(kernel)


def ptxas_resources(kernel) -> tuple[int, int, int]:
    """(registers at launch, spill-store bytes, shared-memory bytes) of a kernel compiled for sm_90 (a Triton or a
    Gluon one), from the ptxas Triton ships."""
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", ptx.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return int(registers.group(1)), int(spills.group(1)) if spills else 0, kernel.metadata.shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", default=TILES, help="comma-separated BLOCK_MxBLOCK_NxBLOCK_KxWARPSxSTAGES")
    ap.add_argument("--chunk", type=int, default=896, help="the K partition (K whole for the 0.5B gate/up)")
    args = ap.parse_args()
    print(f"Triton {triton.__version__}, sm_90a; registers / spill bytes / shared bytes")
    print("| tile | linear | gated (half the columns) |")
    print("|---|---|---|")
    for tile in (t.strip() for t in args.tiles.split(",") if t.strip()):
        bm, bn, bk, warps, stages = (int(v) for v in tile.split("x"))
        common = dict(HAS_BIAS=False, CHUNK=args.chunk, BLOCK_M=bm, BLOCK_K=bk, GROUP_M=8, IEEE=False, UPCAST=False,
                      PDL=True)
        linear = resources(_matmul_kernel, LINEAR_ARGS, dict(PARALLEL=False, BLOCK_N=bn, FLAT=False, **common),
                           warps, stages)
        gated = resources(_gate_up_silu_kernel, GATED_ARGS, dict(BLOCK_N=bn // 2, **common), warps, stages)
        print(f"| {tile} | {' / '.join(map(str, linear))} | {' / '.join(map(str, gated))} |")


if __name__ == "__main__":
    main()
