"""Selection program of our fused-MoE family: the nearest row of a tuned table keyed by token count.

Stock selection (as SGLang's `try_get_optimal_moe_config`) takes the row whose key is nearest the
batch's token count, so the tile — and with it how each token's expert outputs are reduced along K —
follows the batch. The token count itself cannot be pinned (the kernel needs the real one), so the
cut falls inside the program on the row key: one pin fixes every field of the config.
"""
from __future__ import annotations

from detent_rl.kernels.programs.sglang.moe_config import H200_E128_N768  # as SGLang 0.5.23 ships it
from detent_rl.selir import Fact, Unpinnable, assume, nearest_key, require, selection

INT32_MAX = 2**31 - 1


@selection(name="fused_moe")
def fused_moe_program(num_tokens: Unpinnable[int], num_experts: Fact[int], top_k: Fact[int],
                      hidden_size: Fact[int], intermediate_size: Fact[int], max_num_tokens: Fact[int],
                      smem_bytes: Fact[int], dtype_bytes: Fact[int]):
    assume(1 <= num_tokens <= max_num_tokens)
    row_key = nearest_key(H200_E128_N768, num_tokens)
    cfg = H200_E128_N768[row_key]
    # moe_align pads each expert's token list to a multiple of BLOCK_SIZE_M: the sorted-id buffer
    # is sized for the worst case of every expert holding a partial block.
    max_padded = num_tokens * top_k + num_experts * (cfg.BLOCK_SIZE_M - 1)
    stage = (cfg.BLOCK_SIZE_M + cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * dtype_bytes
    require(hidden_size % cfg.BLOCK_SIZE_K == 0, "K must be a whole number of BLOCK_SIZE_K tiles")
    require(stage * cfg.num_stages <= smem_bytes, "the pipelined tiles must fit in shared memory")
    return {
        "config": cfg,
        "even_ks": hidden_size % cfg.BLOCK_SIZE_K == 0,
        "int64_offsets": max_padded * (2 * intermediate_size) > INT32_MAX,
    }


# Qwen3-30B-A3B at TP 1 on one H200: 128 experts, top-8, hidden 2048, expert intermediate 768.
REFERENCE_FACTS = {"num_experts": 128, "top_k": 8, "hidden_size": 2048, "intermediate_size": 768,
                   "max_num_tokens": 8192, "smem_bytes": 227 * 1024, "dtype_bytes": 2}

PROGRAM = fused_moe_program
