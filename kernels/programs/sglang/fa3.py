"""SGLang 0.5.23 -> FlashAttention-3 (sgl_kernel.flash_attn): num_splits, PackGQA and tile sizes.

SGLang side (`sglang==0.5.23` wheel, `srt/layers/attention/flashattention_backend.py` 338-342):
`num_splits = 1 if --enable-deterministic-inference else 0` (0 lets FA3 decide), `pack_gqa` and
`sm_margin` are not passed; decode calls `flash_attn_with_kvcache` with `cu_seqlens_q`,
`seqused_k = cache_seqlens` and a page table, so FA3 sees varlen + paged KV and
`seqlen_k = page_table.size(1) * page_size` (the page-table width, not the longest request).

FA3 side, read at sgl-project/sgl-flash-attn `sgl-kernel` tip 10d78675 (byte-identical there to
Dao-AILab main for these parts; the exact pin bcf72ccc of sglang-kernel 0.4.10 was not seen):
  * `hopper/flash_api.cpp`: `mha_fwd` window/causal set-up (775-786, 959-966), `set_params_fprop`
    causal/local flags (126-139), `get_pagedkv_tma` (395-404), `get_pack_gqa` (406-420),
    `get_num_splits` (422-451), `round_up_headdim[v]` (472-497), `PREPARE_VARLEN_MAX_BATCHES_1CTA`;
  * `hopper/heuristics.h`: `should_pack_gqa` (9-17), `num_splits_heuristic` (25-59);
  * `hopper/tile_size.h`: `tile_size_fwd_sm90` (10-54), `tile_size_fwd_sm8x` (57-79);
  * `hopper/flash_prepare_scheduler.cu`: the per-request dynamic split of
    `prepare_varlen_num_blocks[_kernel]` (141-160, 219-232), as `tile_scheduler.hpp` reads it;
  * `mha_fwd_get_scheduler_metadata` (flash_api.cpp 500-648), which SGLang calls ahead for FA3
    non-MLA decode (`_compute_scheduler_metadata`, flashattention_backend.py 409-439) with its own
    max_seqlen_k: then the dynamic split comes from those parameters, while mha_fwd's num_splits
    (from the page-table width) still picks the Split template and sizes `out_accum`.

Float arithmetic: C++ computes the wave efficiencies, `should_pack_gqa`'s efficiencies and
`blocks_per_sm = ceilf(float(total) * 1.1f * float(heads) / float(num_sm))` in float32. Plain float64
gives other answers at real inputs (e.g. 4 KV-head m-blocks, 132 SMs, 20 n-blocks: float64 picks 17
splits, float32 18), so every float32 operation is emulated: computed in float64 (exact for products of
float32 values, and correctly rounded twice for quotients since 53 >= 2*24+2) and rounded to float32 by
SelIR's `float32` builtin (whose range analysis knows rounding is monotone).
`total_mblocks >= 0.8f * num_SMs` is the integer test `5 * total >= 4 * num_SMs`: 0.8f * N rounds back
to 4N/5 when that is an integer (< 2**24), and is otherwise at least 0.2 from one.
"""
from __future__ import annotations

from detent_rl.selir import float32, Fact, Runtime, Unpinnable, assume, ceil, record, require, selection

SIZE_L2 = 50 * 1024 * 1024  # num_splits_heuristic's assumed L2
MAX_SPLITS = 128  # get_num_splits passes 128
PREPARE_VARLEN_MAX_BATCHES_1CTA = 992  # above this the prepare kernel uses >1 CTA: no dynamic split
F32_1_1 = 1.10000002384185791015625  # the float32 literal 1.1f, exactly


@record
class Tile:
    kBlockM: int
    kBlockN: int
    MmaPV_is_RS: bool
    IntraWGOverlap: bool


@selection
def round_up_headdim(d: Fact[int]):
    return 64 if d <= 64 else 96 if d <= 96 else 128 if d <= 128 else 192 if d <= 192 else 256


@selection
def round_up_headdimv(d: Fact[int]):
    return 64 if d <= 64 else 96 if d <= 96 else 128 if d <= 128 else 192 if d <= 192 else 256 if d <= 256 else 512


@selection
def tile_size_fwd_sm90(headdim: Fact[int], headdim_v: Fact[int], is_causal: Runtime[bool], is_local: Runtime[bool],
                       element_size: Fact[int], v_colmajor: Fact[bool], paged_kv_non_tma: Runtime[bool],
                       softcap: Fact[bool]):
    if element_size == 2:
        if headdim <= 64:
            if headdim_v == 512:
                return Tile(kBlockM=64, kBlockN=64, MmaPV_is_RS=False, IntraWGOverlap=False)
            if headdim_v == 256:
                return Tile(kBlockM=128, kBlockN=96, MmaPV_is_RS=True, IntraWGOverlap=False)
            n128 = is_causal or is_local or paged_kv_non_tma
            return Tile(kBlockM=192, kBlockN=128 if n128 else 192, MmaPV_is_RS=n128, IntraWGOverlap=True)
        if headdim <= 96:
            return Tile(kBlockM=192, kBlockN=128 if is_local or paged_kv_non_tma else 144,
                        MmaPV_is_RS=False, IntraWGOverlap=True)
        if headdim <= 128:
            n128 = is_causal or is_local or paged_kv_non_tma
            return Tile(kBlockM=128, kBlockN=128 if n128 else 176, MmaPV_is_RS=True, IntraWGOverlap=True)
        if headdim <= 192:
            n = 96 if paged_kv_non_tma or is_local else (128 if headdim_v <= 128 else 112)
            return Tile(kBlockM=128, kBlockN=n, MmaPV_is_RS=True, IntraWGOverlap=True)
        return Tile(kBlockM=128, kBlockN=64 if is_local else 80, MmaPV_is_RS=True, IntraWGOverlap=True)
    if headdim <= 64:
        return Tile(kBlockM=192, kBlockN=160, MmaPV_is_RS=True, IntraWGOverlap=True)
    if headdim <= 96:
        return Tile(kBlockM=192, kBlockN=128, MmaPV_is_RS=True, IntraWGOverlap=True)
    if headdim <= 128:
        n = 160 if paged_kv_non_tma else (192 if v_colmajor or (softcap and is_local) else 224)
        return Tile(kBlockM=128, kBlockN=n, MmaPV_is_RS=True, IntraWGOverlap=True)
    if headdim <= 192:
        return Tile(kBlockM=128, kBlockN=128 if (paged_kv_non_tma or softcap) and is_local else 160,
                    MmaPV_is_RS=True, IntraWGOverlap=True)
    return Tile(kBlockM=128, kBlockN=64 if is_local else 128, MmaPV_is_RS=True, IntraWGOverlap=not paged_kv_non_tma)


@selection
def tile_size_fwd_sm8x(sm86_or_89: Fact[bool], headdim: Fact[int], is_local: Runtime[bool], element_size: Fact[int],
                       paged_kv: Fact[bool], varlen_and_split: Runtime[bool], append_kv: Fact[bool]):
    """(kBlockM, kBlockN) of tile_size_fwd_sm8x (warps, stages and Q_in_regs are not selection points here)."""
    if element_size != 2:
        return (128, 64)
    if headdim <= 64:
        return (128, 80 if varlen_and_split else (96 if is_local else 112))
    if headdim <= 96:
        return (128, 48 if varlen_and_split or is_local else 64)
    if headdim <= 128:
        use_8_warps = sm86_or_89 or varlen_and_split
        n8 = (96 if is_local else 112) if varlen_and_split else (96 if is_local else 128)
        return (128, n8 if use_8_warps else (48 if is_local else 64))
    if headdim <= 192:
        return (128, 64 if append_kv or is_local or varlen_and_split or paged_kv else 96)
    if sm86_or_89:
        return (128, 32 if append_kv else (48 if varlen_and_split or is_local else 64))
    return (128, 48 if append_kv else (64 if varlen_and_split or is_local else 96))


@selection
def num_splits_heuristic(total_mblocks: Runtime[int], num_sms: Fact[int], num_n_blocks: Unpinnable[int],
                         num_m_blocks: Runtime[int], size_one_kv_head: Unpinnable[int],
                         is_causal_or_local: Runtime[bool], max_splits: Fact[int]):
    if 5 * total_mblocks >= 4 * num_sms:  # total_mblocks >= 0.8f * num_SMs (exact, see docstring)
        # Only split when one KV head overflows the L2 and the queries cover the KV twice; never if causal.
        if size_one_kv_head > SIZE_L2 and num_m_blocks >= num_sms * 2 and not is_causal_or_local:
            return min((size_one_kv_head + SIZE_L2 - 1) // SIZE_L2, max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    cap = min(max_splits, num_sms, num_n_blocks)
    max_eff = 0.0
    for s in range(1, 129):
        if s <= cap:
            n_waves = float32(total_mblocks * s / num_sms)
            eff = float32(n_waves / ceil(n_waves))
            max_eff = eff if eff > max_eff else max_eff
    chosen = 0  # the smallest split count within 85% of the best efficiency
    for s in range(1, 129):
        if chosen == 0 and s <= cap:
            n_waves = float32(total_mblocks * s / num_sms)
            if float32(n_waves / ceil(n_waves)) >= 0.85 * max_eff:  # float promoted to double
                chosen = s
    return chosen if chosen > 0 else 1


@selection
def should_pack_gqa(varlen_q: Fact[bool], seqlen_q: Runtime[int], qhead_per_khead: Fact[int], block_m: Runtime[int]):
    if varlen_q:
        return True
    packed = seqlen_q * qhead_per_khead
    nopack_eff = float32(seqlen_q / ((seqlen_q + block_m - 1) // block_m * block_m))
    pack_eff = float32(packed / ((packed + block_m - 1) // block_m * block_m))
    return nopack_eff < 0.9 * pack_eff


@record
class Launch:
    num_splits: int
    pack_gqa: bool
    kBlockM: int
    kBlockN: int
    is_causal: bool
    is_local: bool
    paged_kv_non_tma: bool


@selection
def fa3_params(batch: Runtime[int], seqlen_q: Runtime[int], seqlen_k: Unpinnable[int], num_heads: Fact[int],
               num_heads_k: Fact[int], head_dim: Fact[int], head_dim_v: Fact[int], num_sms: Fact[int], arch: Fact[int],
               page_size: Fact[int], paged_kv: Fact[bool], is_e4m3: Fact[bool], causal: Fact[bool],
               window_left: Fact[int], window_right: Fact[int], attention_chunk: Fact[int], has_softcap: Fact[bool],
               varlen_q: Fact[bool], varlen: Fact[bool], deterministic: Fact[bool]):
    """mha_fwd (and mha_fwd_get_scheduler_metadata) up to num_splits, pack_gqa and the tile."""
    qpk = num_heads // num_heads_k
    d_r = round_up_headdim(head_dim)
    dv_r = d_r if head_dim_v == head_dim else round_up_headdimv(head_dim_v)
    # windows reaching past the sequence mean "no window"; causal == non-causal when seqlen_q == 1,
    # except hdim in (64, 128] with paged KV, kept causal for its kBlockN = 128 tile.
    wl = -1 if window_left >= seqlen_k - 1 else window_left
    wr = -1 if window_right >= seqlen_q - 1 else window_right
    is_causal = causal
    if seqlen_q == 1 and wl == -1 and wr == -1 and attention_chunk == 0:
        if head_dim <= 64 or head_dim > 128 or not paged_kv:
            is_causal = False
    wr = 0 if is_causal else wr
    # set_params_fprop: the causal/local flags, then the effective window sizes.
    p_causal = wl < 0 and wr == 0 and attention_chunk == 0
    p_local = (wl >= 0 or wr >= 0 or attention_chunk >= 1) and not p_causal
    wl = seqlen_k - 1 if wl < 0 else wl
    wr = seqlen_q - 1 if wr < 0 else wr
    if attention_chunk > 0:
        wl = min(wl, attention_chunk - 1)
        wr = min(wr, attention_chunk - 1)
    elem = 1 if is_e4m3 else 2
    pagedkv_tma = False  # get_pagedkv_tma (no leftpad_k, no k_new from SGLang)
    if arch >= 90 and paged_kv:
        t0 = tile_size_fwd_sm90(d_r, dv_r, p_causal, p_local, elem, False, False, has_softcap)
        pagedkv_tma = page_size % t0.kBlockN == 0 and seqlen_q * qpk > t0.kBlockM
    non_tma = paged_kv and not pagedkv_tma
    if arch >= 90:
        tile = tile_size_fwd_sm90(d_r, dv_r, p_causal, p_local, elem, False, non_tma, has_softcap)
        block_m, block_n = tile.kBlockM, tile.kBlockN
    else:
        block_m, block_n = tile_size_fwd_sm8x(arch == 86 or arch == 89, d_r, p_local, elem, paged_kv, varlen, False)
    if deterministic:  # SGLang passes num_splits=1; 0 lets get_num_splits decide
        num_splits = 1
    else:  # get_num_splits; varlen => dynamic split later, so it bounds with batch = 1
        loaded = seqlen_k if not p_local else max(0, min(seqlen_k, wr + wl + 1 + block_m))
        num_n_blocks = (loaded + block_n - 1) // block_n
        num_m_blocks = (seqlen_q * qpk + block_m - 1) // block_m
        size_one_kv_head = seqlen_k * (head_dim + head_dim_v) * elem
        total_mblocks = (1 if varlen else batch) * num_heads_k * num_m_blocks
        num_splits = num_splits_heuristic(total_mblocks, num_sms, num_n_blocks, num_m_blocks, size_one_kv_head,
                                          p_causal or p_local, MAX_SPLITS)
    # get_pack_gqa (run_mha_fwd also forces PackGQA for Sm8x, PagedKVNonTMA and Split)
    if arch < 90 or non_tma or num_splits > 1:
        pack_gqa = True
    elif num_heads == num_heads_k:
        pack_gqa = False
    else:
        pack_gqa = should_pack_gqa(varlen_q, seqlen_q, qpk, block_m)
    if arch < 90:  # the sm8x launch tile sees the split decision
        block_m, block_n = tile_size_fwd_sm8x(arch == 86 or arch == 89, d_r, p_local, elem, paged_kv,
                                              varlen and num_splits > 1, False)
    return Launch(num_splits=num_splits, pack_gqa=pack_gqa, kBlockM=block_m, kBlockN=block_n, is_causal=p_causal,
                  is_local=p_local, paged_kv_non_tma=non_tma)


@selection
def fa3_num_splits(
        batch: Runtime[int], max_seqlen_q: Runtime[int], seqlen_k: Unpinnable[int], metadata_seqlen_k: Unpinnable[int],
        seqused_k: Unpinnable[int], batch_total_blocks: Unpinnable[int],
        num_heads: Fact[int], num_heads_k: Fact[int], head_dim: Fact[int], head_dim_v: Fact[int],
        num_sms: Fact[int], arch: Fact[int], page_size: Fact[int], paged_kv: Fact[bool], is_e4m3: Fact[bool],
        causal: Fact[bool], window_left: Fact[int], window_right: Fact[int], attention_chunk: Fact[int],
        has_softcap: Fact[bool], varlen_q: Fact[bool], varlen_k: Fact[bool], deterministic: Fact[bool],
        scheduler_metadata: Fact[bool], max_context_len: Fact[int], max_batch: Fact[int],
        max_seqlen_q_limit: Fact[int]):
    """`seqlen_k`: FA3's seqlen_k in mha_fwd (page-table width * page_size); `metadata_seqlen_k`: the
    max_seqlen_k SGLang passes to get_scheduler_metadata (the batch's longest KV, or max_context_len);
    `seqused_k`: this request's KV length; `batch_total_blocks`: sum over the batch of
    num_m_blocks * num_n_blocks as the prepare kernel counts them."""
    max_seqlen_k = (max_context_len + page_size - 1) // page_size * page_size
    assume(1 <= batch <= max_batch)
    assume(1 <= max_seqlen_q <= max_seqlen_q_limit)
    assume(1 <= seqlen_k <= max_seqlen_k)
    assume(1 <= metadata_seqlen_k <= max_seqlen_k)
    assume(1 <= seqused_k <= max_seqlen_k)
    assume(seqused_k <= metadata_seqlen_k <= seqlen_k)
    assume(1 <= batch_total_blocks <= max_batch * max_seqlen_q_limit * num_heads * max_seqlen_k)
    require(num_heads % num_heads_k == 0, "num_heads must be a multiple of num_heads_k")
    varlen = varlen_q or varlen_k  # cu_seqlens_q/k or seqused_k given
    # mha_fwd's own parameters pick the Split template and size out_accum ...
    main = fa3_params(batch, max_seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, head_dim_v, num_sms, arch,
                      page_size, paged_kv, is_e4m3, causal, window_left, window_right, attention_chunk, has_softcap,
                      varlen_q, varlen, deterministic)
    require(1 <= main.num_splits <= 256, "TORCH_CHECK(num_splits <= 256)")
    # ... while SGLang's precomputed scheduler metadata (FA3 non-MLA decode) ran the prepare kernel with
    # parameters from its own max_seqlen_k; without it mha_fwd runs prepare with its own.
    meta = main
    if scheduler_metadata and varlen:
        meta = fa3_params(batch, max_seqlen_q, metadata_seqlen_k, num_heads, num_heads_k, head_dim, head_dim_v,
                          num_sms, arch, page_size, paged_kv, is_e4m3, causal, window_left, window_right,
                          attention_chunk, has_softcap, varlen_q, True, deterministic)
    # This request's split: the varlen scheduler of a Split kernel reads prepare's num_splits_dynamic.
    if main.num_splits == 1:
        split_dynamic = 1  # no Split template: one split
    elif not varlen:
        split_dynamic = main.num_splits
    elif batch > PREPARE_VARLEN_MAX_BATCHES_1CTA or meta.num_splits == 1:
        split_dynamic = 1
    else:
        n_blocks = (seqused_k + meta.kBlockN - 1) // meta.kBlockN
        heads = num_heads_k if meta.pack_gqa else num_heads
        scaled = float32(float32(float32(float(batch_total_blocks)) * F32_1_1) * heads)
        # >= 1 since total >= 1; the max(., 1) only tells SelIR so (no implicit division check)
        blocks_per_sm = max(ceil(float32(scaled / num_sms)), 1)
        split_dynamic = max(min((n_blocks + blocks_per_sm - 1) // blocks_per_sm, meta.num_splits), 1)
    require(1 <= split_dynamic <= main.num_splits, "a request's splits fit out_accum (sized by num_splits)")
    return {"num_splits": main.num_splits, "split_kernel": main.num_splits > 1, "num_splits_dynamic": split_dynamic,
            "pack_gqa": main.pack_gqa, "kBlockM": main.kBlockM, "kBlockN": main.kBlockN,
            "is_causal": main.is_causal, "is_local": main.is_local, "paged_kv_non_tma": main.paged_kv_non_tma}


# Qwen3-30B-A3B-like attention (32 q heads, 4 kv heads, head dim 128, 40960 context) on one H200
# (132 SMs), TP1, bf16 KV, page size 1, SGLang decode (varlen + paged, causal, no window),
# speculative verify up to 4 query tokens, CUDA graphs up to 256 requests.
REFERENCE_FACTS = {
    "num_heads": 32, "num_heads_k": 4, "head_dim": 128, "head_dim_v": 128, "num_sms": 132, "arch": 90,
    "page_size": 1, "paged_kv": True, "is_e4m3": False, "causal": True, "window_left": -1,
    "window_right": -1, "attention_chunk": 0, "has_softcap": False, "varlen_q": True, "varlen_k": True,
    "deterministic": False, "scheduler_metadata": True, "max_context_len": 40960, "max_batch": 256,
    "max_seqlen_q_limit": 4,
}

PROGRAM = fa3_num_splits  # the module's main program (for the registry and reports)
