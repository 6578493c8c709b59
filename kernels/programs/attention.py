"""Selection program of our attention family (paged, varlen, causal, split-KV).

Stock selection follows FlashAttention-3's heuristics (reused from the FA3 transcription in
`sglang/fa3.py`: `num_splits_heuristic`, `should_pack_gqa`; tiles are our Triton kernel's): the split count
comes from the batch (total m-blocks = batch × kv heads × m-blocks, n-blocks from the longest KV,
wave efficiency over the SMs) and, for decode (one query per request), causality is dropped for
some head dims, which changes the KV tile width. Both change how a query row's keys are grouped
and therefore its bits.

Our kernels add the `split_stride` knob: a fixed split size aligned to absolute KV positions
(0 keeps FA3's count-based splitting). With a fixed stride, prefill, chunked prefill, decode and
the trainer's one-shot prefill cut every row's keys at the same places.

The query tile (`block_m`, with its `num_warps`), `pack_gqa` (a tile's rows are queries times the heads of
one GQA group), `num_stages` and `kv_prefetch` (the next KV block's pages and keys loaded while a block is
reduced) are declared a schedule: they change which CTA computes a row and how far ahead it loads, not the
row's arithmetic (a row's softmax sum is a dot, whose order no tile height changes; the KV tile `block_n`
regroups the keys and stays pinned)
(`kernels/attention.py`; the GPU tests compare packed and unpacked bits,
bench/attention_decode_sweep.py the stages), so they may follow the batch in every arm. Decode takes
two stages: a packed 64x64 decode tile ran 8.7 µs in two and 10.6 µs in three at batch 1, 28 and 41 µs
at batch 256 (H200, Qwen2-0.5B heads). The prefetch took a packed 64x64 decode from 7.9 to 6.8 µs at
batch 1 and from 23.3 to 19.5 µs at batch 2 x 12,000 keys, and slowed batch 256 from 28.4 to 33.2 µs
and 128-key tiles everywhere (bench/attention_decode_sweep.py): hence its rule below.
"""
from __future__ import annotations

from detent_rl.kernels.programs.sglang.fa3 import num_splits_heuristic, round_up_headdim, should_pack_gqa
from detent_rl.selir import Fact, Runtime, Unpinnable, assume, knob, require, selection

MAX_SPLITS = 128  # the partial-output buffer holds this many splits per row
SPLIT_STRIDES = (0, 256, 512, 1024, 2048, 4096)
PDL_MAX_BATCH = 992  # FA3: one CTA of the varlen scheduler handles at most 31 * 32 batches
INT32_MAX = 2**31 - 1


@selection
def triton_tile(is_causal: Runtime[bool]):
    """Our Triton kernel's tiles, chosen the FA3 way: causal (prefill) batches take square 64x64
    tiles; non-causal single-query batches take one 16-row query tile and 128-key KV tiles."""
    if is_causal:
        return (64, 64)
    return (16, 128)


@selection(name="attention", schedule=("block_m", "num_warps", "pack_gqa", "num_stages", "kv_prefetch"))
def attention_program(batch: Runtime[int], max_seqlen_q: Unpinnable[int], num_tokens: Unpinnable[int],
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
    is_decode = max_seqlen_q == 1
    wide_kv = d <= 64 or d > 128 or page_size == 0
    is_causal = not (is_decode and wide_kv)
    _, block_n = triton_tile(is_causal)
    if split_stride != 0 and split_stride % block_n != 0:
        block_n = 64  # our split kernel needs KV tiles that divide the fixed split size
    # The query tile follows the step itself (a schedule: a row's sums do not see the tile's height), not
    # `is_causal`, which the cut pins: a pinned prefill KV width still decodes in 16-row tiles.
    block_m, _ = triton_tile(not (max_seqlen_q < 2 and wide_kv))
    num_warps = 8 if block_m >= 128 else 4
    stage_bytes = (block_m + 2 * block_n) * d * dtype_bytes
    num_stages = 2 if 3 * stage_bytes > smem_bytes else 3
    if max_seqlen_q < 2:  # not `is_decode`, which the cut pins
        num_stages = 2  # a decode row's few KV tiles: the third stage only lengthens the prologue

    seqlen_k = min(max_seqlen_k, max_context)
    num_n_blocks = (seqlen_k + block_n - 1) // block_n
    num_m_blocks = (max_seqlen_q * qheads_per_kv + block_m - 1) // block_m
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
        pack_gqa = should_pack_gqa(False, max_seqlen_q, qheads_per_kv, block_m)
    if qheads_per_kv > block_m:
        pack_gqa = False  # our kernel packs whole groups into one tile's rows
    # the KV prefetch (pages and keys one block ahead, in registers) in decode batches whose tiles fit in
    # one wave: a latency-bound call whose few CTAs each walk a chain of blocks (the splits of a long
    # context add CTAs, but the KV length is not read here: a decode graph serves every length). With
    # more CTAs than SMs the registers it holds cost more occupancy than it hides latency, and 128-key
    # tiles hold twice as many. 64-row tiles only: a 16-row decode tile ran slower with it in every case
    # measured (H200, Qwen2-0.5B heads, 64-key tiles: 5.9 against 6.1 µs at batch 1, 20.8 against 28.8 at
    # batch 256, 71.4 against 74.4 at 2 x 12,000 keys; docs/BENCHMARKS.md, session 27).
    kv_prefetch = block_n == 64 and block_m == 64 and max_seqlen_q < 2 and \
        batch * (num_kv_heads if pack_gqa else num_heads) <= num_sms

    require(1 <= num_splits <= MAX_SPLITS, "the partial-output buffer holds MAX_SPLITS splits")
    require(split_size % block_n == 0, "a KV tile must not straddle two splits")
    require(num_splits * split_size >= max_seqlen_k, "the splits must cover the longest KV")
    require(stage_bytes * num_stages <= smem_bytes, "the pipelined tiles must fit in shared memory")
    return {
        "block_m": block_m, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages,
        "num_splits": num_splits, "split_size": split_size, "split_kernel": num_splits > 1,
        "pack_gqa": pack_gqa, "kv_prefetch": kv_prefetch,
        "int64_index": num_tokens * num_heads * head_dim > INT32_MAX,
        "varlen_pdl": batch <= PDL_MAX_BATCH,
    }


# A 0.5B-class Qwen2 (14 q heads, 2 kv heads, head dim 64) served on one H200.
REFERENCE_FACTS = {
    "num_heads": 14, "num_kv_heads": 2, "head_dim": 64, "num_sms": 132, "page_size": 128,
    "max_context": 4096, "max_batch": 256, "max_num_tokens": 8192, "smem_bytes": 227 * 1024,
    "dtype_bytes": 2,
}

PROGRAM = attention_program

DEPLOYMENTS = {
    "qwen2-0.5b/h200": REFERENCE_FACTS,
    # Llama-3-8B-class (32 q heads, 8 kv heads, head dim 128), 16-token pages, 32k context.
    "llama3-8b/h200": {**REFERENCE_FACTS, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                       "page_size": 16, "max_context": 32768},
}
