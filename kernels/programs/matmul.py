"""Selection program of our matmul / linear family.

Stock selection keys the tile config on the batch's row count M (bucketed, the way vLLM's and
SGLang's Triton GEMM config tables do), including a split-K for skinny decode GEMMs — the classic
source of batch-dependent bits: split-K changes where a row's partial sums are combined. A
`pad_m` knob rounds M up before bucketing (engines pad to CUDA-graph capture sizes). The solver's
pin is the bucket key: one value that fixes every field of the row.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Unpinnable, assume, knob, record, require, selection


@record
class GemmTile:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: int


# Rows keyed by the largest M they serve, in increasing order.
GEMM_TILES = {
    16: GemmTile(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4, split_k=2),
    32: GemmTile(block_m=32, block_n=64, block_k=64, group_m=4, num_warps=4, num_stages=4, split_k=2),
    64: GemmTile(block_m=64, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=4, split_k=1),
    128: GemmTile(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3, split_k=1),
    256: GemmTile(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3, split_k=1),
    8192: GemmTile(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3, split_k=1),
}
PADS = (1, 8, 16, 64, 128)


@selection
def gemm_bucket(m: Unpinnable[int]):
    """The smallest table key that is at least m (the last key for anything larger)."""
    bucket = 8192
    for k in (256, 128, 64, 32, 16):
        if m <= k:
            bucket = k
    return bucket


@selection(name="matmul")
def matmul_program(m: Unpinnable[int], n: Fact[int], k: Fact[int], max_m: Fact[int], smem_bytes: Fact[int],
                   dtype_bytes: Fact[int]):
    assume(1 <= m <= max_m)
    pad = knob("pad_m", PADS, 1)
    m_padded = (m + pad - 1) // pad * pad
    bucket = gemm_bucket(m_padded)
    row = GEMM_TILES[bucket]
    # a short K cannot feed every split-K part: split no further than K has blocks
    k_blocks = (k + row.block_k - 1) // row.block_k
    # as Triton's autotuner prunes: no more pipeline stages than shared memory holds (fp32 tiles are twice
    # the bytes of the bf16 ones the table was written for)
    stage = (row.block_m + row.block_n) * row.block_k * dtype_bytes
    stages = min(row.num_stages, smem_bytes // stage)
    tile = GemmTile(block_m=row.block_m, block_n=row.block_n, block_k=row.block_k, group_m=row.group_m,
                    num_warps=row.num_warps, num_stages=stages, split_k=min(row.split_k, k_blocks))
    require(stages >= 1, "one stage of the tiles must fit in shared memory")
    return {"tile": tile, "pad_m": pad}


# The MLP down-projection of a 0.5B-class Qwen2 (intermediate 4864 -> hidden 896) on one H200.
REFERENCE_FACTS = {"n": 896, "k": 4864, "max_m": 8192, "smem_bytes": 227 * 1024, "dtype_bytes": 2}

PROGRAM = matmul_program
