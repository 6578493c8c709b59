"""Selection programs of the row-wise kernel families: RMSNorm, log-softmax and elementwise ops.

A row reduction's bits depend on how the row is cut into blocks before the partial sums are
combined. Stock selection widens the block for small batches the way vLLM launches its RMSNorm
kernels (`fused_add_rms_norm`: at most 1024 threads per row below 256 tokens, 256 above), so a
row's sum of squares is associated differently once the batch grows. The solver pins the block.
Elementwise families (SiLU-and-mul, rotary, embedding) reduce nothing: their block only tiles the
row, and their selection reads no batch-dependent value.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Unpinnable, assume, selection

BLOCKS = (128, 256, 512, 1024, 2048, 4096)


@selection
def pow2_at_least(n: Fact[int]):
    out = BLOCKS[-1]
    for b in (2048, 1024, 512, 256, 128):
        if n <= b:
            out = b
    return out


@selection(name="rmsnorm")
def rmsnorm_program(num_rows: Unpinnable[int], hidden: Fact[int], max_rows: Fact[int]):
    assume(1 <= num_rows <= max_rows)
    max_block = 1024 if num_rows < 256 else 256
    block = min(pow2_at_least(hidden), max_block)
    return {"block": block, "num_warps": 4 if block <= 1024 else 8}


@selection(name="log_softmax")
def log_softmax_program(num_rows: Unpinnable[int], vocab: Fact[int], max_rows: Fact[int]):
    assume(1 <= num_rows <= max_rows)
    # few rows: one wide block per program keeps the SMs busy; many rows: narrower blocks
    block = 4096 if num_rows <= 64 else 1024
    return {"block": block, "num_warps": 8 if block >= 4096 else 4}


@selection(name="elementwise")
def elementwise_program(num_rows: Unpinnable[int], width: Fact[int], max_rows: Fact[int]):
    assume(1 <= num_rows <= max_rows)
    return {"block": min(pow2_at_least(width), 1024)}


# Qwen2-0.5B-class: hidden 896, vocabulary 151,936; up to 8,192 rows per step.
REFERENCE_FACTS = {"hidden": 896, "max_rows": 8192}
LOG_SOFTMAX_FACTS = {"vocab": 151936, "max_rows": 8192}

PROGRAMS = {
    "rmsnorm": (rmsnorm_program, {"qwen2-0.5b": REFERENCE_FACTS}),
    "log_softmax": (log_softmax_program, {"qwen2-0.5b": LOG_SOFTMAX_FACTS}),
    "elementwise": (elementwise_program, {"qwen2-0.5b-mlp": {"width": 4864, "max_rows": 8192}}),
}
