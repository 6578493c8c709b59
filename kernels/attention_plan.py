"""The eager attention call's two launches, recorded per call shape and replayed for the step's other layers.

Online serving's prefill and mixed steps run attention eagerly between the graphed pieces (`rollout/step_graphs.py`):
24 calls a step for the 0.5B, each the wrapper's checks and allocations, then two launches (the attention kernel and
the split combine) through `launch.launch`, whose binder specialises ~45 arguments every time. On a slow H100 host
that was ~200 µs a call, 4.7 ms of a 14 ms mixed step (docs/BENCHMARKS.md, session 48). Every layer of a step calls
with the same shapes, strides and metadata; only q, the layer's caches and the output change. So the first call of a
call shape records both launches (`launch.Recorded`) and later calls go straight into Triton's launcher with their
tensors swapped in: the same compiled variants and the same arguments Triton's own path would pass, so the same bits.

The key fixes everything those variants' specialisation and the recorded (non-tensor) arguments read: the tensors'
shapes, strides and dtypes, the selection's parameters, the scale, PDL, which tensors are one object (a decode
graph's metadata passes one tensor as both pos0 and token_pos; the one-split epilogue passes the output for the
partials), and that every pointer is 16-byte aligned (Triton specialises a pointer on it; a call with one that is
not takes the plain path). Anything `Recorded` will not replay (hooks, DETENT_LAUNCH=triton, the interpreter) takes
the plain path too, as every launch of ours does.
"""
from __future__ import annotations

from typing import Optional

import torch

from detent_rl.kernels.attention_combine import combine_kv_splits
from detent_rl.kernels.launch import Recorded

_PLANS: dict = {}  # call shape (`plan_for`'s key) -> _Plan
_MAX_PLANS = 512  # serving's steps vary in tokens and tiles: the table is cleared when it holds this many


class _Plan:
    """One call shape's recorded launches: `attn` and `combine` (None: not recorded yet, e.g. the variant was
    compiling; False: not replayable; the combine stays None where the kernel writes the output itself)."""

    __slots__ = ("attn", "combine", "direct", "ready")

    def __init__(self, direct: bool) -> None:
        self.attn = self.combine = None
        self.direct = direct
        self.ready = False

    def record(self, attn: tuple, combine: Optional[tuple], tensors: dict) -> None:
        """Record the call just launched: `attn` and `combine` are (kernel, grid, args, kwargs)."""
        roles = {id(t): role for role, t in tensors.items()}
        if self.attn is None:
            self.attn = Recorded.of(attn[0], attn[1], attn[2], attn[3], roles)
        if combine is not None and self.combine is None:
            self.combine = Recorded.of(combine[0], combine[1], combine[2], combine[3], roles)
        self.ready = bool(self.attn) and (self.direct or bool(self.combine))

    def replay(self, tensors: dict, split_size: int, fixed: bool = False) -> bool:
        """Launch the call for `tensors`; False (nothing launched) where the plain path must run."""
        if not self.attn(tensors):
            return False
        if not self.direct and not self.combine(tensors):  # (a launch hook added between the two)
            combine_kv_splits(tensors["m"], tensors["l"], tensors["o"], tensors["out"], tensors["tp"], None, split_size,
                              fixed)
        return True


def plan_for(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, out: torch.Tensor,
             params: tuple) -> Optional[_Plan]:
    """The plan of this call's shape (`params`: every other argument the launches read, `direct` among them), made
    on first sight; None where a pointer is not 16-byte aligned."""
    bt, cu, pos0, tr, tq, tp = meta.block_table, meta.cu_q, meta.pos0, meta.tile_req, meta.tile_q0, meta.token_pos
    if (q.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr() | out.data_ptr() | bt.data_ptr() | cu.data_ptr()
            | pos0.data_ptr() | tr.data_ptr() | tq.data_ptr() | tp.data_ptr()) % 16:
        return None
    key = (q.device, q.dtype, q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.dtype, v_cache.shape,
           v_cache.stride(), out.dtype, out.stride(), bt.shape, bt.stride(), cu.shape, tr.shape, tp.shape,
           (bt.dtype, cu.dtype, pos0.dtype, tr.dtype, tq.dtype, tp.dtype), meta.block_m, meta.pack,
           pos0 is tp, k_cache is v_cache, out is q, params)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(direct=params[-1])
    return plan
