"""SGLang 0.5.23, Triton attention backend: how decode picks `num_kv_splits` (SelIR transcription).

Transcribes, from the `sglang==0.5.23` wheel (paths relative to the `sglang/` package):
  * `srt/layers/attention/triton_backend.py`
      - `_mla_decode_kv_splits_cap` (lines 80-90),
      - `TritonAttnBackend.__init__`: `max_kv_splits`, `split_tile_size`, `static_kv_splits` (~315-372),
      - `TritonAttnBackend.get_num_kv_splits` (lines 431-480): static, deterministic and heuristic paths;
  * `kernels/ops/attention/metadata.py`, Triton kernel `get_num_kv_splits_triton` (lines 8-60);
  * `kernels/ops/attention/decode_attention.py`, grid of `_decode_att_m_fwd` /
    `_decode_grouped_att_m_fwd` (~430-460, ~796-867): `(batch, head blocks, max_kv_splits)`.

One evaluation selects the split count of ONE request. The kernel reads batch-wide values, so the
inputs are: `seq_len` (this request's KV length: a `Request` input, which no other request changes),
`max_seq_len` / `min_seq_len` (longest and shortest KV length in the batch, as the kernel sees them:
CUDA-graph padding rows count with length 1) and `num_seq` (requests in the call). So the deterministic
path (a request's splits from its own length and a fixed split tile) needs no pin, and the heuristic
path's cut pins the split count. In speculative draft decode `num_group` = topk requests share one
sequence; it is a deployment fact here.

`tl.log2` has no SelIR counterpart: `ext_device_core_count` emulates the kernel's float32
`int32(D * max(log2(L / 64), 1.0))` with a correctly rounded float32 log2 found by bisection (exact
real arithmetic differs from the GPU by one wherever D * log2(L / 64) is near an integer).
Not transcribed: the HIP-only paths (gfx950 MLA launch plan, Lean decode) and the `uneven_batch`
flag, which only rotates work on HIP and never changes a split count.
"""
from __future__ import annotations

from detent_rl.selir import float32, Fact, Request, Runtime, Unpinnable, assume, knob, record, require, selection

MLA_DECODE_MIN_BLOCK_KV = 32  # _MLA_DECODE_MIN_BLOCK_KV
EXT_SEQ_DIVISOR = 64  # ext_seq_len = max_seq_len / 64.0
BLOCK_H = 16  # decode kernels' head block
# SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE (default 256) in deterministic mode; the other values are
# settings an operator may choose, offered to the solver as a knob.
SPLIT_TILE_CHOICES = (64, 128, 256, 512, 1024)
DEFAULT_SPLIT_TILE = 256
PLATFORMS = ("cuda", "hip", "hip_gfx942", "xpu", "other")


@record
class DecodeSetup:
    max_kv_splits: int
    split_tile_size: int  # 0 means None
    static_kv_splits: bool


@selection
def next_power_of_2(n: Fact[int]):
    """`triton.next_power_of_2` of a positive deployment constant."""
    p = 1
    for _ in range(40):
        if p < n:
            p = p * 2
    return p


@selection
def backend_setup(max_context_len: Fact[int], device_core_count: Fact[int],
                  triton_attention_num_kv_splits: Fact[int], triton_attention_split_tile_size: Fact[int],
                  use_mla: Fact[bool], platform: Fact[str], static_kv_splits_env: Fact[bool],
                  enable_deterministic: Fact[bool]):
    """TritonAttnBackend.__init__: the buffer-sizing split cap and the mode flags."""
    max_kv_splits = triton_attention_num_kv_splits
    if use_mla and platform != "xpu":
        if device_core_count > 0:  # _mla_decode_kv_splits_cap
            sm_cap = next_power_of_2(device_core_count)
            ctx_cap = next_power_of_2((max_context_len + MLA_DECODE_MIN_BLOCK_KV - 1) // MLA_DECODE_MIN_BLOCK_KV)
            max_kv_splits = max(max_kv_splits, min(sm_cap, ctx_cap))
        if platform == "hip_gfx942":
            max_kv_splits = min(max_kv_splits, 256)
    static = static_kv_splits_env
    if enable_deterministic:
        split_tile_size = knob("split_tile_size", SPLIT_TILE_CHOICES, DEFAULT_SPLIT_TILE)
        static = False
    else:
        split_tile_size = triton_attention_split_tile_size
    if split_tile_size > 0:
        max_kv_splits = (max_context_len + split_tile_size - 1) // split_tile_size
    return DecodeSetup(max_kv_splits=max_kv_splits, split_tile_size=split_tile_size, static_kv_splits=static)


@selection
def ext_device_core_count(max_seq_len: Unpinnable[int], device_core_count: Fact[int]):
    """int32(D * max(log2(float32(max_seq_len) / 64.0), 1.0)) in float32, with no log2 in SelIR.

    y = log2(L / 64) is found as the float32 nearest to it (a bisection over the 2**23 float32 values
    of its binade, comparing 64 * 2 ** t with L at the rounding midpoints t), then multiplied by D in
    float32 and truncated, as the kernel does. On an H200 (Triton 3.6.0) this matched the kernel for
    every L < 2**20 and D in {1, 16, 78, 108, 114, 132, 148, 170, 304} but two (D=148, L=363847 and
    727694, where tl.log2 is 1 ulp off); exact real arithmetic would differ at 636 of them.
    """
    if max_seq_len <= 2 * EXT_SEQ_DIVISOR:  # log2 <= 1: the factor is clamped to 1.0
        return device_core_count
    e = 0  # y in [2**e, 2**(e+1)): y >= 2**k  <=>  L >= 64 * 2 ** (2 ** k)
    for k in (1, 2, 3, 4):
        if max_seq_len >= EXT_SEQ_DIVISOR * 2 ** (2 ** k):
            e = k
    base = 2.0 ** e
    ulp = 2.0 ** (e - 23)
    lo = 0  # largest m in [0, 2**23] with y >= base + (m - 1/2) ulp, i.e. round(y) = base + m ulp
    hi = 2 ** 23 + 1
    for _ in range(24):
        mid = (lo + hi) // 2
        fits = 2.0 ** (base + (mid - 0.5) * ulp) * EXT_SEQ_DIVISOR <= max_seq_len
        lo = mid if fits else lo
        hi = hi if fits else mid
    return int(float32(device_core_count * (base + lo * ulp)))


@selection
def kv_splits_kernel(seq_len: Request[int], max_seq_len: Unpinnable[int], min_seq_len: Unpinnable[int],
                     num_seq: Runtime[int], num_group: Fact[int], num_head: Fact[int], num_kv_head: Fact[int],
                     max_kv_splits: Fact[int], device_core_count: Fact[int]):
    """get_num_kv_splits_triton, for the lane of one request (all divisions are integer cdiv)."""
    if max_seq_len * 8 < min_seq_len * 10:  # shortest > 0.8 * longest: treat the batch as uniform
        min_seq_len = max_seq_len
    max_kv_splits_1 = min((max_seq_len + min_seq_len - 1) // min_seq_len, max_kv_splits)
    kv_chunk_size_1 = (max_seq_len + max_kv_splits_1 - 1) // max_kv_splits_1
    # "hack to let num_kv_split grow with seqlen gradually"
    ext_cores = ext_device_core_count(max_seq_len, device_core_count)
    num_kv_group = num_head // num_kv_head
    if num_kv_group == 1:
        token_grid = num_seq * num_group * num_head
    else:  # mirrors _decode_grouped_att_m_fwd's head blocks
        block_h = min(BLOCK_H, num_kv_group)
        token_grid = num_seq * num_group * ((num_head + block_h - 1) // block_h)
    max_kv_splits_2 = min((ext_cores + token_grid - 1) // token_grid, max_kv_splits)
    kv_chunk_size_2 = (max_seq_len + max_kv_splits_2 - 1) // max_kv_splits_2
    return max((seq_len + kv_chunk_size_1 - 1) // kv_chunk_size_1,
               (seq_len + kv_chunk_size_2 - 1) // kv_chunk_size_2)


@selection
def triton_decode_num_kv_splits(
        seq_len: Request[int], max_seq_len: Unpinnable[int], min_seq_len: Unpinnable[int],
        num_seq: Runtime[int],
        num_head: Fact[int], num_kv_head: Fact[int], num_group: Fact[int], max_context_len: Fact[int],
        device_core_count: Fact[int], max_num_seq: Fact[int], triton_attention_num_kv_splits: Fact[int],
        triton_attention_split_tile_size: Fact[int], use_mla: Fact[bool], platform: Fact[str],
        static_kv_splits_env: Fact[bool], enable_deterministic: Fact[bool]):
    assume(1 <= seq_len <= max_context_len)
    assume(1 <= max_seq_len <= max_context_len)
    assume(1 <= min_seq_len <= max_context_len)
    assume(min_seq_len <= seq_len <= max_seq_len)
    assume(1 <= num_seq <= max_num_seq)
    require(platform in PLATFORMS, "unknown platform")
    require(num_head % num_kv_head == 0 and num_group >= 1)
    require(max_context_len < 2 ** 24, "lengths are exact in float32 (the kernel casts them)")
    setup = backend_setup(max_context_len, device_core_count, triton_attention_num_kv_splits,
                          triton_attention_split_tile_size, use_mla, platform, static_kv_splits_env,
                          enable_deterministic)
    max_kv_splits = setup.max_kv_splits
    if (setup.static_kv_splits or device_core_count <= 0) and not enable_deterministic:
        path = "static"
        num_kv_splits = max_kv_splits
    elif setup.split_tile_size > 0 and enable_deterministic:
        path = "deterministic"  # depends on this request's own length only
        num_kv_splits = (seq_len + setup.split_tile_size - 1) // setup.split_tile_size
    else:
        path = "heuristic"
        num_kv_splits = kv_splits_kernel(seq_len, max_seq_len, min_seq_len, num_seq, num_group, num_head,
                                         num_kv_head, max_kv_splits, device_core_count)
    # The stage-1 grid has max_kv_splits split programs; a request's splits past its count exit early,
    # so any count in [1, max_kv_splits] is a valid launch (and the combine handles empty splits).
    require(1 <= num_kv_splits <= max_kv_splits, "num_kv_splits within the launched grid")
    kv_group = num_head // num_kv_head
    grid_head_blocks = num_head if kv_group == 1 else (num_head + min(BLOCK_H, kv_group) - 1) // min(BLOCK_H, kv_group)
    return {"num_kv_splits": num_kv_splits, "max_kv_splits": max_kv_splits,
            "grid_head_blocks": grid_head_blocks, "path": path}


# Qwen3-30B-A3B-like (32 q heads, 4 kv heads, 40960 context) on one H200 (132 SMs), TP1, CUDA graphs
# up to 256 requests, no speculative decoding, SGLang defaults otherwise.
REFERENCE_FACTS = {
    "num_head": 32, "num_kv_head": 4, "num_group": 1, "max_context_len": 40960,
    "device_core_count": 132, "max_num_seq": 256, "triton_attention_num_kv_splits": 8,
    "triton_attention_split_tile_size": 0, "use_mla": False, "platform": "cuda",
    "static_kv_splits_env": False, "enable_deterministic": False,
}

PROGRAM = triton_decode_num_kv_splits  # the module's main program (for the registry and reports)
