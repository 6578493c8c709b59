"""The Hopper kernels compile for sm_90a with the installed Triton, on the CPU (ptxas: registers, spills, shared
memory). The warpgroup kernels are Gluon, whose API moves between Triton releases (3.6, the device's, names TMA's
copies `async_copy_*`; later releases `async_load`/`async_store` and raise on the old names): a Triton upgrade that
breaks them fails here, not on the first Hopper call of a user's run. Compiling proves no bits (the GPU tests do)."""
from __future__ import annotations

import re

import pytest

from bench_scripts import load
from detent_rl.kernels.matmul_wgmma import HAS_GLUON

pytestmark = pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon Hopper API")


def test_the_warpgroup_linear_compiles_for_sm90_without_spilling():
    """`matmul_wgmma`'s kernel at the schedules the selection takes on the down projections: the sequential chunks
    (two fp32 accumulators in a 128 x 128 tile: the register budget that rules out 128 x 256), a 64 x 64 tile, and
    the parallel form's units."""
    compile_ = load("sm90_compile")
    for block, ring, split in ((128, 4, False), (64, 6, False), (128, 4, True)):
        registers, spill, shared = compile_.wgmma_resources(block, block, 64, ring, 4864, 640, split)
        assert spill == 0 and registers <= 255 and 0 < shared <= 227 * 1024, (block, split, registers, spill, shared)


def test_the_warp_specialized_probe_compiles_for_sm90():
    """`bench/gemm_ws_probe.py`'s kernel (a loader warp, a warpgroup a 64-row slice, staggered chunk ends): 128 x 128
    with chunks and a lag, and 128 x 256 with K whole and a bias, within shared memory and without spills."""
    probe = load("gemm_ws_probe")
    compile_ = load("sm90_compile")
    from triton.experimental.gluon import language as gl
    import torch

    for k, chunk, block_n, lag, bias in ((4864, 640, 128, 2, False), (896, 896, 256, 0, True)):
        meta = dict(probe.meta(k, chunk, 128, block_n, 64, 6, lag), HAS_BIAS=bias)
        host = torch.empty(256, k, dtype=torch.bfloat16)
        descs = [probe.TensorDescriptor.from_tensor(host, [r, c], probe._layout(r, c, gl.bfloat16))
                 for r, c in ((64, 64), (block_n, 64), (64, block_n))]
        args = dict(zip(("a_desc", "b_desc", "c_desc"), descs), bias_ptr="*bf16", M="i32", N="i32")
        registers, spill, shared = compile_.gluon_resources(probe.ws_chunked_kernel, args, meta, 4)
        assert spill == 0 and 0 < shared <= 227 * 1024, (k, chunk, block_n, registers, spill, shared)


def test_the_fold_probe_compiles_for_sm90_without_spilling():
    """`bench/gemm_fold_probe.py`'s kernel (the parallel form's units, the tile's last one adding the chunk sums):
    64 x 128 and 128 x 128 on the 0.5B down projection, within shared memory and without spills (its first form,
    unrolled over the chunks with the accumulator live, spilled 336-1,772 bytes a thread)."""
    probe = load("gemm_fold_probe")
    for block_m, ring, tile_major in ((64, 4, True), (128, 4, False)):
        registers, spill, shared = probe.fold_resources("down05", block_m, 128, ring, tile_major)
        assert spill == 0 and 0 < shared <= 227 * 1024, (block_m, registers, spill, shared)


def test_the_split_combines_compile_for_sm90_without_spilling():
    """Both attention combines (`kernels/attention_combine.py`: a program a (row, head), a program a row) with the
    log-sum-exp and PDL, at the 0.5B's 14 heads (padded to 16) and the 8B's 32; the split size at run time (the
    stock arm's) and compiled in (the pinned arms', `fixed_split`)."""
    compile_ = load("sm90_compile")
    from detent_rl.kernels.attention_combine import COMBINE_HEADS_UNROLL, COMBINE_HEADS_WARPS, COMBINE_UNROLL, \
        COMBINE_WARPS, _combine_heads_kernel, _combine_kernel
    args = dict(m_ptr="*fp32", l_ptr="*fp32", o_ptr="*fp32", out_ptr="*bf16", pos_ptr="*i32", lse_ptr="*fp32",
                stride_mt="i32", stride_mh="i32", stride_ot="i32", stride_oh="i32", stride_os="i32:16",
                stride_outt="i32:16", stride_outh="i32:16", stride_lh="i32", split_len="i32:16")
    for split in (0, 512):
        consts = dict(HEAD_DIM=64, UNROLL=COMBINE_UNROLL, LSE=True, PDL=True, SPLIT=split)
        registers, spill, _ = compile_.resources(_combine_kernel, args, consts, COMBINE_WARPS, 1)
        assert spill == 0 and registers <= 255, (split, registers, spill)
        for heads in (16, 32):
            registers, spill, _ = compile_.resources(_combine_heads_kernel, {**args, "HEADS": "i32"},
                                                     {**consts, "HEADS_P2": heads, "UNROLL": COMBINE_HEADS_UNROLL},
                                                     COMBINE_HEADS_WARPS, 1)
            assert spill == 0 and registers <= 255, (split, heads, registers, spill)


def _divisions(ptx: str) -> int:
    """Integer divisions and remainders in a kernel's PTX (`div.s32`, `rem.u64`, ...: by a run-time value; a
    compile-time divisor folds into shifts or multiplies before PTX)."""
    return len(re.findall(r"\b(?:div|rem)\.[su](?:32|64)\b", ptx))


def test_the_decode_kernels_take_no_runtime_division():
    """The decode step's latency-bound kernels reach their loads without an integer division by a run-time value
    (some 20 dependent instructions each on sm_90): the linear's decode tiles (GROUP_M 1) read their tile off a 3-D
    grid, and the rotary store takes the head and rotary dims compiled in. Control: the grouped tile order's two."""
    compile_ = load("sm90_compile")
    from detent_rl.kernels.matmul import _matmul_kernel
    from detent_rl.kernels.rotary import _rotary_kernel, _rotary_store_kernel
    for parallel in (True, False):
        consts = dict(HAS_BIAS=True, PARALLEL=parallel, CHUNK=640, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUP_M=1,
                      IEEE=False, UPCAST=False, FLAT=False, PDL=True)
        grid3 = compile_.compile_sm90(_matmul_kernel, compile_.LINEAR_ARGS, dict(consts, GRID3=True), 4, 4)
        grouped = compile_.compile_sm90(_matmul_kernel, compile_.LINEAR_ARGS, dict(consts, GRID3=False), 4, 4)
        assert _divisions(grid3.asm["ptx"]) == 0 and _divisions(grouped.asm["ptx"]) == 2, parallel
    ptr = dict(pos_ptr="*i64", slot_ptr="*i64", cos_ptr="*bf16", sin_ptr="*bf16")
    for fn in (_rotary_kernel, _rotary_store_kernel):
        args = {n: "*bf16" if n.endswith("_ptr") else "i32" for n in fn.arg_names if n.islower()}
        kernel = compile_.compile_sm90(fn, {**args, **{k: v for k, v in ptr.items() if k in args}},
                                       dict(HEAD_DIM=64, ROT_DIM=64, BLOCK=1024, PDL=True), 4, 1)
        assert _divisions(kernel.asm["ptx"]) == 0, fn.__name__


def test_the_resident_rmsnorm_row_compiles_for_sm90_without_spilling():
    """`rmsnorm`'s forward kernel with the row held in registers (one and two 1,024-wide blocks: the 0.5B's and
    the 1.5B's hidden sizes) and with the loops, with the residual: no spills, and the held rows read x and the
    residual once (Triton 3.9 here: 3 and 6 global load instructions with the weights, against the loops' 5)."""
    compile_ = load("sm90_compile")
    from detent_rl.kernels.rmsnorm import _rmsnorm_kernel
    args = dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", res_out_ptr="*bf16", n_cols="i32:16",
                eps="fp32")
    loads = {}
    for resident in (0, 1, 2):
        kernel = compile_.compile_sm90(_rmsnorm_kernel, args, dict(HAS_RESIDUAL=True, BLOCK=1024, PDL=True,
                                                                   RESIDENT=resident), 4, 1)
        registers, spill, _ = compile_.ptxas_resources(kernel)
        assert spill == 0 and registers <= 255, (resident, registers, spill)
        loads[resident] = len(re.findall(r"\bld\.global", kernel.asm["ptx"]))
    assert loads[1] < loads[0] and loads[2] == 2 * loads[1], loads



def _around_the_wait(ptx: str) -> tuple[int, int, int]:
    """(global loads before a kernel's first `griddepcontrol.wait`, global loads after it, global stores before it)
    in its PTX, predicated or not."""
    ops = re.findall(r"^\s*(?:@%p\d+\s+)?(ld\.global|st\.global|griddepcontrol\.wait)", ptx, re.M)
    wait = ops.index("griddepcontrol.wait")
    return ops[:wait].count("ld.global"), ops[wait:].count("ld.global"), ops[:wait].count("st.global")


def test_the_host_fed_loads_run_before_the_wait():
    """Under PDL the decode attention reads its metadata (the tile's request and first query, the query offsets,
    the cached length) and its first block's pages before `griddepcontrol.wait`, while the predecessor runs, and
    q and the KV blocks after it; the rotary store its position and rope rows before and q, k, v after; the
    combine its row's position before and the partials after. No store before a wait (`pdl`; `test_pdl.py`
    checks the source, this the compiled order). Control: the partials' and the caches' loads follow the wait."""
    compile_ = load("sm90_compile")
    from detent_rl.kernels.attention import _attention_kernel
    from detent_rl.kernels.attention_combine import _combine_kernel
    from detent_rl.kernels.rotary import _rotary_store_kernel
    fp32 = ("m_ptr", "l_ptr", "o_ptr", "lse_ptr")
    args = {n: ("*bf16" if n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr") else "*fp32" if n in fp32 else "*i32")
            if n.endswith("_ptr") else "fp32" if n == "scale" else "i32" for n in _attention_kernel.arg_names
            if n.islower()}
    for block_n, prefetch in ((128, False), (64, True)):  # D1's decode tile; the prefetched loop's
        consts = dict(GROUP=7, PACK=7, PAGE=128, HEAD_DIM=64, BLOCK_M=16, BLOCK_N=block_n, SPLIT=128, IEEE=False,
                      UPCAST=False, PREFETCH=prefetch, DIRECT=False, LSE=False, TREE_SUM=False, PDL=True)
        before, after, stores = _around_the_wait(compile_.compile_sm90(_attention_kernel, args, consts, 4, 2)
                                                 .asm["ptx"])
        # five metadata loads and the pages: one load where a block's keys share a page, a load a key in the
        # prefetched loop's two blocks of 64 (Triton 3.9); then q and the blocks' keys and values
        assert (before == 6 if not prefetch else before > 6) and after > 0 and stores == 0, (prefetch, before, after)
    args = {n: ("*i32" if n == "pos_ptr" else "*bf16" if n == "out_ptr" else "*fp32") if n.endswith("_ptr")
            else "i32" for n in _combine_kernel.arg_names if n.islower()}
    ptx = compile_.compile_sm90(_combine_kernel, args, dict(HEAD_DIM=64, UNROLL=4, LSE=False, PDL=True, SPLIT=128),
                                1, 1).asm["ptx"]
    assert _around_the_wait(ptx)[0] == 1 and _around_the_wait(ptx)[1] > 0 and _around_the_wait(ptx)[2] == 0
    args = {n: ("*i64" if n in ("pos_ptr", "slot_ptr") else "*bf16") if n.endswith("_ptr") else "i32"
            for n in _rotary_store_kernel.arg_names if n.islower()}
    ptx = compile_.compile_sm90(_rotary_store_kernel, args, dict(HEAD_DIM=64, ROT_DIM=64, BLOCK=1024, PDL=True), 4,
                                1).asm["ptx"]
    before, after, stores = _around_the_wait(ptx)
    assert before == 3 and after > 0 and stores == 0, (before, after, stores)
