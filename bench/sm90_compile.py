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
    return ptxas_resources(compile_sm90(fn, args, consts, warps, stages))


def compile_sm90(fn, args: dict[str, str], consts: dict, warps: int, stages: int):
    """`fn` compiled for sm_90 by the installed Triton, its arguments as `resources` takes them (its `asm["ptx"]`
    is the kernel's PTX)."""
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
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


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


def gluon_resources(fn, args: dict, consts: dict, warps: int) -> tuple[int, int, int]:
    """`ptxas_resources` of a Gluon kernel compiled for sm_90a: `args` gives each other parameter a Triton type
    ("*bf16", "i32") or a host value to specialise on as a launch would (a TMA descriptor), `consts` the constexprs."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    signature, constexprs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name], constexprs[(i,)] = "constexpr", consts[name]
        else:
            signature[name] = args[name] if isinstance(args[name], str) else mangle_type(args[name])
    kernel = triton.compile(GluonASTSource(fn, signature, constexprs=constexprs, attrs={}),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    return ptxas_resources(kernel)


def wgmma_resources(block_m: int, block_n: int, block_k: int, ring: int, k: int, chunk: int,
                    split: bool = False) -> tuple[int, int, int]:
    """The warpgroup linear's kernel (`kernels/matmul_wgmma.py`, unswapped) at a tile, ring and partition of K, as
    `matmul_wgmma_plan` launches it: sequential chunks (two accumulators where K is cut), or `split` (one chunk a
    unit, fp32 sums to the workspace)."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from detent_rl.kernels.matmul_wgmma import _chunked_wgmma_kernel

    def desc(rows: int, cols: int, dtype: torch.dtype, gl_dtype):
        t = torch.empty(256, max(k, 256), dtype=dtype)
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype)
        return TensorDescriptor.from_tensor(t, [rows, cols], layout)

    out_dt = (torch.float32, gl.float32) if split else (torch.bfloat16, gl.bfloat16)
    args = dict(a_desc=desc(block_m, block_k, torch.bfloat16, gl.bfloat16),
                b_desc=desc(block_n, block_k, torch.bfloat16, gl.bfloat16), c_desc=desc(block_m, block_n, *out_dt),
                out_ptr="*bf16", bias_ptr="*bf16", M="i32", N="i32", stride_om="i32", ws_rows="i32")
    chunks = -(-k // chunk)
    consts = dict(HAS_BIAS=False, NUM_CHUNKS=1 if split else chunks, CHUNK_BLOCKS=chunk // block_k, GROUP_M=8,
                  NUM_BUFFERS=ring, SWAP=False, SPLITS=chunks if split else 1, PDL=True, num_warps=block_m // 16)
    return gluon_resources(_chunked_wgmma_kernel, args, consts, block_m // 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", default=TILES, help="comma-separated BLOCK_MxBLOCK_NxBLOCK_KxWARPSxSTAGES")
    ap.add_argument("--chunk", type=int, default=896, help="the K partition (K whole for the 0.5B gate/up)")
    ap.add_argument("--wgmma", action="store_true", help="also the warpgroup kernel at the 0.5B down projection's "
                    "tiles (`wgmma_resources`)")
    args = ap.parse_args()
    print(f"Triton {triton.__version__}, sm_90a; registers / spill bytes / shared bytes")
    print("| tile | linear | gated (half the columns) |")
    print("|---|---|---|")
    for tile in (t.strip() for t in args.tiles.split(",") if t.strip()):
        bm, bn, bk, warps, stages = (int(v) for v in tile.split("x"))
        common = dict(HAS_BIAS=False, CHUNK=args.chunk, BLOCK_M=bm, BLOCK_K=bk, GROUP_M=8, IEEE=False, UPCAST=False,
                      PDL=True)
        linear = resources(_matmul_kernel, LINEAR_ARGS, dict(PARALLEL=False, BLOCK_N=bn, FLAT=False, GRID3=False,
                                                             **common), warps, stages)
        gated = resources(_gate_up_silu_kernel, GATED_ARGS, dict(BLOCK_N=bn // 2, **common), warps, stages)
        print(f"| {tile} | {' / '.join(map(str, linear))} | {' / '.join(map(str, gated))} |")
    if args.wgmma:
        print("\n| warpgroup kernel, 0.5B down (K 4,864, chunk 640) | registers / spill bytes / shared bytes |\n"
              "|---|---|")
        for bm, bn, ring, split in ((128, 128, 4, False), (64, 64, 6, False), (128, 128, 4, True)):
            got = wgmma_resources(bm, bn, 64, ring, 4864, 640, split)
            print(f"| {bm} x {bn} x 64, ring {ring}, {'split' if split else 'sequential'} | "
                  f"{' / '.join(map(str, got))} |")


if __name__ == "__main__":
    main()
