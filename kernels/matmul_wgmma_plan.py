"""The warpgroup linear's host side: `linear_wgmma` launches `matmul_wgmma`'s kernel, each call shape planned once.

A call shape (M, N, K, strides, the bias's alignment, the schedule) gets a `_Plan`: the ring depth shared memory
allows, the grid (a persistent launch's from the multiprocessors' resident CTAs), the constexprs. Its first compiled
launch is recorded (`launch.Recorded`) and later ones go straight into Triton's launcher with the tensors swapped in:
~40 µs of host time a call against ~130 through Triton's descriptors and `run` (docs/BENCHMARKS.md, session 32);
with `matmul.linear`'s routes and every descriptor kept per address, ~24 against cuBLAS's ~18 (session 33).
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from detent_rl.kernels.launch import Recorded, launch
from detent_rl.kernels.matmul_wgmma import HAS_GLUON, SMEM_BYTES, tile_fits

if HAS_GLUON:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from detent_rl.kernels.matmul_wgmma import _chunked_wgmma_kernel, gl


SM_SMEM_BYTES = 228 * 1024  # an sm_90 multiprocessor's shared memory (each CTA also reserves 1 KiB of it)
_RESIDENT: dict = {}  # compiled configuration -> CTAs one multiprocessor holds at once


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, cols: int, dt: Any) -> Any:
    """A TMA block's shared-memory layout: a pure function of the block and the dtype, and ~6 µs of host time
    to build (three a call, ~100 calls a forward)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dt)


@functools.lru_cache(maxsize=None)
def _num_sms(device: Any) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _resident_ctas(compiled: Any, num_warps: int) -> int:
    """How many CTAs of a compiled kernel one multiprocessor holds at once: its shared memory and its
    registers (65,536 a multiprocessor) decide."""
    compiled._init_handles()
    by_smem = SM_SMEM_BYTES // (compiled.metadata.shared + 1024)
    by_regs = 65536 // max(1, compiled.n_regs * 32 * num_warps)
    return max(1, min(by_smem, by_regs))


def linear_wgmma(x: Any, w: Any, bias: Any = None, **schedule: Any) -> Any:
    """`x @ w.T + bias` under `linear`'s K partition `chunk` (a multiple of `block_k`), in `block_m` x
    `block_n` output tiles (`tile_fits`) with warpgroup MMAs: the same fp32 operations, so the same bits,
    as `linear` at any schedule. With `swap_ab` each MMA computes the tile transposed (w's rows as its A
    operand, x's as its B: a decode batch of 16-64 rows does not pad out a 64-row MMA). The ring holds
    `num_buffers` K blocks, fewer where shared memory ends. `persistent` launches only as many programs as
    the multiprocessors hold at once, each running every so-many-th unit in turn: the ring runs on from one
    unit into the next (its first blocks load under the last MMAs of the one before) and a unit's store
    under the next one's MMAs (`programs`, where positive, caps the programs instead: tests). `split` is the
    partition's parallel form (where K is cut): each (tile, chunk) a unit whose fp32 sum goes to a workspace,
    the sums then added in chunk order by `matmul.combine_splits`, as `linear(parallel=True)` does. The
    tiles' arithmetic is unchanged.

    A call shape's launch is planned once (`_Plan`: tiles, ring, grid, the compiled kernel and its launcher's
    arguments) and replayed with only the tensors' addresses changed, each TMA descriptor encoded once per address
    (docs/BENCHMARKS.md, session 32: ~130 µs of host time a call before, against ~20 for cuBLAS)."""
    return plan_wgmma(x, w, bias, **schedule)(x, w, bias)


def plan_wgmma(x: Any, w: Any, bias: Any = None, *, chunk: int, block_k: int = 64, group_m: int = 8,
               num_buffers: int = 4, pdl: bool = False, block_m: int = 128, block_n: int = 128, swap_ab: bool = False,
               persistent: bool = False, programs: int = 0, split: bool = False) -> "_Plan":
    """The `_Plan` of `linear_wgmma`'s call shape, made on its first call (`schedule`: `chunk`, `block_k`, ...,
    `split`, as `linear_wgmma` describes them): `plan(x, w, bias)` runs this call or any other of the shape
    (`matmul.linear` keeps the plan per call and skips this lookup)."""
    M, K = x.shape
    N = w.shape[0]
    # (the bias's 16-byte alignment too: Triton specialises a pointer argument on it)
    key = (x.device, x.dtype, M, N, K, x.stride(0), w.stride(0), None if bias is None else bias.data_ptr() % 16,
           chunk, block_k, group_m, num_buffers, pdl, block_m, block_n, swap_ab, persistent, programs, split)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:  # a long online run meets many token counts: start over, never grow unbounded
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(x, w, bias, chunk, block_k, group_m, num_buffers, pdl, block_m, block_n, swap_ab,
                                   persistent, programs, split)
    return plan


_MAX_PLANS = 8192
_PLANS: dict = {}  # call shape (`linear_wgmma`'s key) -> _Plan


class _Plan:
    """One call shape of `linear_wgmma`: everything but the tensors' addresses. Its first launch builds the TMA
    descriptors and launches through `launch.launch` (Triton compiles the variant on a first call); once the
    variant is compiled, that launch (and the parallel form's combine) is recorded (`launch.Recorded`), and
    later launches of the shape run straight into Triton's launcher with the tensors swapped in: the same
    compiled variant and the same arguments Triton's own path would pass (its specialisation reads nothing the
    key does not fix: M, N, the strides, the bias's alignment; the operands' is checked by `applies`, and
    torch's allocations' is 256 bytes), so the same bits. Each descriptor is encoded once per address."""

    def __init__(self, x, w, bias, chunk, block_k, group_m, num_buffers, pdl, block_m, block_n, swap_ab, persistent,
                 programs, split):
        import triton

        M, K = x.shape
        N = w.shape[0]
        assert chunk % block_k == 0, f"chunk {chunk} must be whole BLOCK_K {block_k} blocks"
        chunk = min(chunk, -(-K // block_k) * block_k)
        self.splits = splits = triton.cdiv(K, chunk) if split else 1
        assert splits == 1 or not swap_ab, "the parallel form stores whole tiles: no swapped tiles"
        assert splits == 1 or (N * 4) % 16 == 0, "the workspace's fp32 rows must be 16-byte aligned for TMA"
        assert tile_fits(block_m, block_n, chunk < K and splits == 1, swap_ab), \
            f"no warpgroup tile {block_m} x {block_n} (chunk {chunk}, K {K}, swap_ab {swap_ab}, split {split})"
        stage = (block_m + block_n) * block_k * x.element_size()
        # the swapped tile is stored from registers; a chunk's sum is stored in fp32
        c_tile = 0 if swap_ab else block_m * block_n * (4 if splits > 1 else x.element_size())
        # no deeper than a unit's K blocks and one (the kernel's refills reach into the next unit only)
        unit_blocks = chunk // block_k if splits > 1 else -(-K // block_k)
        num_buffers = min(num_buffers, (SMEM_BYTES - 1024 - c_tile) // stage, unit_blocks + 1)
        assert num_buffers >= 2, "a slot for the MMA in flight and one loading"
        self.ws_rows = triton.cdiv(M, block_m) * block_m if splits > 1 else 0  # whole tiles a chunk's slice
        self.ws_shape = (splits, self.ws_rows, N)
        self.out_shape = (M, N)
        self.blocks = (block_m, block_n, block_k)
        self.swap_ab, self.persistent, self.programs = swap_ab, persistent, programs
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        self.grid = tiles * splits
        self.meta = dict(HAS_BIAS=bias is not None and splits == 1,
                         NUM_CHUNKS=1 if splits > 1 else triton.cdiv(K, chunk), CHUNK_BLOCKS=chunk // block_k,
                         GROUP_M=group_m, NUM_BUFFERS=num_buffers, SWAP=swap_ab, SPLITS=splits, PDL=pdl,
                         num_warps=(block_n if swap_ab else block_m) // 16)
        if pdl:
            self.meta["launch_pdl"] = True
        # the launches recorded (`launch.Recorded`): the kernel's, the combine's; None: not yet, False: never
        self.kernel = self.combine = None

    def __call__(self, x, w, bias):
        """`x @ w.T (+ bias)`, a new tensor, for operands of this plan's call shape."""
        out = x.new_empty(self.out_shape)
        if self.out_shape[0] == 0:
            return out
        ws = x.new_empty(self.ws_shape, dtype=torch.float32) if self.splits > 1 else None
        self.launch(x, w, bias, out, ws)
        return out

    def _descriptors(self, x, w, out, ws):
        block_m, block_n, block_k = self.blocks
        dt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16

        def desc(t: Any, rows: int, cols: int, dtype: Any = dt) -> Any:
            return TensorDescriptor.from_tensor(t, [rows, cols], _smem_layout(rows, cols, dtype))

        x_desc, w_desc = desc(x, block_m, block_k), desc(w, block_n, block_k)
        a_desc, b_desc = (w_desc, x_desc) if self.swap_ab else (x_desc, w_desc)
        if ws is not None:
            c_desc = desc(ws.view(-1, ws.shape[2]), block_m, block_n, gl.float32)
        else:
            c_desc = b_desc if self.swap_ab else desc(out, block_m, block_n)  # (unused when swapped)
        return a_desc, b_desc, c_desc

    def _args(self, x, w, bias, out, ws):
        a_desc, b_desc, c_desc = self._descriptors(x, w, out, ws)
        M, N = (w.shape[0], x.shape[0]) if self.swap_ab else (x.shape[0], w.shape[0])
        return (a_desc, b_desc, c_desc, out, bias if bias is not None else out, M, N, out.stride(0), self.ws_rows)

    def launch(self, x, w, bias, out, ws) -> None:
        """`x @ w.T (+ bias)` into `out` (through the workspace `ws`, combined, in the parallel form)."""
        tensors = {"x": x, "w": w, "out": out, "ws": ws, "bias": bias}
        if self.kernel and self.kernel(tensors):
            if ws is not None and not (self.combine and self.combine(tensors)):
                self._combine(tensors)
            return
        args = self._args(x, w, bias, out, ws)
        grid = self.grid
        if self.persistent:
            key = (x.device, x.dtype, self.blocks, self.swap_ab) + tuple(self.meta.values())
            if key not in _RESIDENT:
                _RESIDENT[key] = _resident_ctas(_chunked_wgmma_kernel.warmup(*args, grid=(1,), **self.meta),
                                                self.meta["num_warps"])
            grid = self.grid = min(grid, self.programs or _num_sms(x.device) * _RESIDENT[key])
        launch(_chunked_wgmma_kernel, (grid,), *args, **self.meta)
        if self.kernel is None:
            roles = _roles(tensors)
            if ws is not None:
                roles[id(args[2].base)] = "ws"  # (the workspace's descriptor describes a view of it)
            self.kernel = Recorded.of(_chunked_wgmma_kernel, (grid,), args, self.meta, roles)
        if ws is not None:
            self._combine(tensors)

    def _combine(self, tensors: dict) -> None:
        from detent_rl.kernels.matmul import combine_splits  # (matmul imports this module)

        kernel, grid, args, kwargs = combine_splits(tensors["ws"], tensors["bias"], tensors["out"])
        if self.combine is None:
            self.combine = Recorded.of(kernel, grid, args, kwargs, _roles(tensors))


def _roles(tensors: dict) -> dict:
    """`Recorded`'s roles of a call's tensors: id -> role."""
    return {id(t): role for role, t in tensors.items() if t is not None}
