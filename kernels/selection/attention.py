"""Selection program of our attention family (paged, varlen, causal, split-KV).

Stock selection follows FlashAttention-3's heuristics (hopper/heuristics.h `num_splits_heuristic`,
tile_size.h `tile_size_fwd_sm90`, flash_api.cpp `get_num_splits` / `get_pack_gqa`): the split count
comes from the batch (total m-blocks = batch × kv heads × m-blocks, n-blocks from the longest KV,
wave efficiency over the SMs) and, for decode (one query per request), causality is dropped for
some head dims, which changes the KV tile width. Both change how a query row's keys are grouped
and therefore its bits.

Our kernels add the `split_stride` knob: a fixed split size aligned to absolute KV positions
(0 keeps FA3's count-based splitting). With a fixed stride, prefill, chunked prefill, decode and
the trainer's one-shot prefill cut every row's keys at the same places.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Runtime, Unpinnable, assume, ceil, knob, record, require, selection

MAX_SPLITS = 128  # the partial-output buffer holds this many splits per row
SPLIT_STRIDES = (0, 256, 512, 1024, 2048, 4096)
L2_BYTES = 50 * 1024 * 1024  # FA3's assumed L2 size
PDL_MAX_BATCH = 992  # FA3: one CTA of the varlen scheduler handles at most 31 * 32 batches
INT32_MAX = 2**31 - 1


@record
class Tile:
    block_m: int
    block_n: int


@selection
def round_up_headdim(head_dim: Fact[int]):
    if head_dim <= 64:
        return 64
    if head_dim <= 96:
        return 96
    if head_dim <= 128:
        return 128
    if head_dim <= 192:
        return 192
    return 256


@selection
def tile_fwd_16bit(d: Fact[int], is_causal: Runtime[bool], paged_kv_non_tma: Fact[bool]):
    """tile_size_fwd_sm90 for 16-bit inputs, no local window, head_dim_v == head_dim."""
    if d <= 64:
        use128 = is_causal or paged_kv_non_tma
        return Tile(block_m=192, block_n=128 if use128 else 192)
    if d <= 96:
        return Tile(block_m=192, block_n=128 if paged_kv_non_tma else 144)
    if d <= 128:
        use128 = is_causal or paged_kv_non_tma
        return Tile(block_m=128, block_n=128 if use128 else 176)
    if d <= 192:
        return Tile(block_m=128, block_n=96 if paged_kv_non_tma else 128)
    return Tile(block_m=128, block_n=80)


@selection
def num_splits_heuristic(total_mblocks: Runtime[int], num_sms: Fact[int], num_n_blocks: Runtime[int],
                         num_m_blocks: Runtime[int], size_one_kv_head: Runtime[int],
                         is_causal_or_local: Runtime[bool], max_splits: Fact[int]):
    """FA3's split count: fill the SMs with the fewest splits within 85 % of the best wave efficiency."""
    if total_mblocks >= 0.8 * num_sms:
        if size_one_kv_head > L2_BYTES and num_m_blocks >= num_sms * 2 and not is_causal_or_local:
            return min((size_one_kv_head + L2_BYTES - 1) // L2_BYTES, max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    cap = min(max_splits, num_sms, num_n_blocks)
    best = 0.0
    for s in range(1, MAX_SPLITS + 1):
        if s <= cap:
            waves = total_mblocks * s / num_sms
            best = max(best, waves / ceil(waves))
    chosen = 1
    found = False
    for s in range(1, MAX_SPLITS + 1):
        if s <= cap and not found:
            waves = total_mblocks * s / num_sms
            if waves / ceil(waves) >= 0.85 * best:
                chosen = s
                found = True
    return chosen


@selection
def attention(batch: Runtime[int], max_seqlen_q: Unpinnable[int], num_tokens: Unpinnable[int],
              max_seqlen_k: Unpinnable[int], num_heads: Fact[int], num_kv_heads: Fact[int],
              head_dim: Fact[int], num_sms: Fact[int], page_size: Fact[int], max_context: Fact[int],
              max_batch: Fact[int], max_num_tokens: Fact[int], smem_bytes: Fact[int],
              dtype_bytes: Fact[int]):
    assume(1 <= batch <= max_batch)
    assume(1 <= max_seqlen_q <= max_num_tokens)
    assume(1 <= num_tokens <= max_num_tokens)
    assume(1 <= max_seqlen_k <= max_context)
    assume(batch <= num_tokens and max_seqlen_q <= num_tokens)
    split_stride = knob("split_stride", SPLIT_STRIDES, 0)

    d = round_up_headdim(head_dim)
    qheads_per_kv = num_heads // num_kv_heads
    paged_kv_non_tma = page_size % 128 != 0
    # FA3 drops causality for single-query batches except hdim 128 with paged KV: decode then
    # reads the KV cache in wider tiles than prefill did.
    is_causal = not (max_seqlen_q == 1 and (d <= 64 or d > 128 or page_size == 0))
    tile = tile_fwd_16bit(d, is_causal, paged_kv_non_tma)
    block_n = tile.block_n
    if split_stride != 0 and split_stride % block_n != 0:
        block_n = 128  # our split kernel needs KV tiles that divide the fixed split size
    num_warps = 8 if tile.block_m >= 128 else 4
    stage_bytes = (tile.block_m + 2 * block_n) * d * dtype_bytes
    num_stages = 2 if 3 * stage_bytes > smem_bytes else 3

    seqlen_k = min(max_seqlen_k, max_context)
    num_n_blocks = (seqlen_k + block_n - 1) // block_n
    num_m_blocks = (max_seqlen_q * qheads_per_kv + tile.block_m - 1) // tile.block_m
    size_one_kv_head = seqlen_k * 2 * head_dim * dtype_bytes
    total_mblocks = batch * num_kv_heads * num_m_blocks
    num_splits = num_splits_heuristic(total_mblocks, num_sms, num_n_blocks, num_m_blocks,
                                      size_one_kv_head, is_causal, MAX_SPLITS)
    if split_stride == 0:
        split_size = (num_n_blocks + num_splits - 1) // num_splits * block_n
    else:
        split_size = split_stride
        num_splits = min((max_context + split_stride - 1) // split_stride, MAX_SPLITS)

    if paged_kv_non_tma or num_splits > 1:
        pack_gqa = True
    elif qheads_per_kv == 1:
        pack_gqa = False
    else:
        nopack = max_seqlen_q / ((max_seqlen_q + tile.block_m - 1) // tile.block_m * tile.block_m)
        packed = max_seqlen_q * qheads_per_kv
        pack = packed / ((packed + tile.block_m - 1) // tile.block_m * tile.block_m)
        pack_gqa = nopack < 0.9 * pack

    require(1 <= num_splits <= MAX_SPLITS, "the partial-output buffer holds MAX_SPLITS splits")
    require(split_size % block_n == 0, "a KV tile must not straddle two splits")
    require(num_splits * split_size >= max_seqlen_k, "the splits must cover the longest KV")
    require(stage_bytes * num_stages <= smem_bytes, "the pipelined tiles must fit in shared memory")
    return {
        "block_m": tile.block_m, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages,
        "num_splits": num_splits, "split_size": split_size, "split_kernel": num_splits > 1,
        "pack_gqa": pack_gqa,
        "int64_index": num_tokens * num_heads * head_dim > INT32_MAX,
        "varlen_pdl": batch <= PDL_MAX_BATCH,
    }


# A 0.5B-class Qwen2 (14 q heads, 2 kv heads, head dim 64) served on one H200.
REFERENCE_FACTS = {
    "num_heads": 14, "num_kv_heads": 2, "head_dim": 64, "num_sms": 132, "page_size": 128,
    "max_context": 4096, "max_batch": 256, "max_num_tokens": 8192, "smem_bytes": 227 * 1024,
    "dtype_bytes": 2,
}

PROGRAM = attention
