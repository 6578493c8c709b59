"""Rotary position embedding: one cos/sin table by absolute position, applied per token.

Table (`rope_cos_sin`), built once with HF semantics, then shared by rollout and trainer:
    inv_freq, scale = HF rope init for the config's rope type (computed on the CPU, as HF does)
    freqs = arange(max_positions).float()[:, None] * inv_freq[None, :]      (on `device`)
    cos, sin = (cat(freqs, freqs).cos() * scale).to(dtype), (... .sin() * scale).to(dtype)
Rope types whose frequencies depend on the sequence length ("dynamic", "longrope") are refused:
the same position would rotate differently in a short rollout and a long training sequence.

Apply (`apply_rotary`), HF `apply_rotary_pos_emb` with "rotate_half" (non-interleaved) pairs,
every product and sum rounded to the model dtype exactly as HF's eager bf16 ops round:
    y[j]        = rnd(rnd(x[j] * cos[p, j])        + rnd(-x[j + h] * sin[p, j]))         j < h
    y[j + h]    = rnd(rnd(x[j + h] * cos[p, j + h]) + rnd(x[j] * sin[p, j + h]))
    y[rot:]     = x[rot:]                               (partial rotary: the rest passes through)
with h = rotary_dim / 2, p = positions[token], rnd = rounding to the model dtype (identity in
fp32; the GPU kernel is compiled without FMA contraction so fp32 matches eager torch too).

Apply and store (`rotary_store`), the no-grad forward's one launch per layer: the same rotation of
q and k, and the new k with v written into the paged caches at each token's flat slot, exactly what
`apply_rotary` + `kv_store.store_kv` give (the same `_rotate`, the same flags; a store moves bits).
"""
from typing import Any

import torch

from detent_rl.kernels._triton import INDEX_DTYPES, check_block, pdl, pdl_enter, require_triton, tl, triton, use_triton
from detent_rl.kernels.launch import launch
from detent_rl.kernels.kv_store import check_store, store_kv

SEQUENCE_DEPENDENT = ("dynamic", "longrope")


def _rope_parameters(config: Any) -> dict:
    params = getattr(config, "rope_parameters", None)  # transformers >= 5
    if params is None:
        params = dict(getattr(config, "rope_scaling", None) or {})  # transformers 4.x
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return dict(params)


def rope_inv_freq(config: Any) -> tuple[torch.Tensor, float]:
    """(inv_freq fp32 [rotary_dim / 2] on the CPU, attention scaling) for an HF config."""
    params = _rope_parameters(config)
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params["type"]
    rope_type = params.get("rope_type", "default")
    if rope_type in SEQUENCE_DEPENDENT:
        raise ValueError(f"rope type {rope_type!r} recomputes its frequencies from the sequence length, so "
                         f"a position would rotate differently in rollout and training; refusing it")
    if rope_type == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Llama/Qwen2's own default ignores partial_rotary_factor; they all have 1.0 anyway.
        factor = params.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
        dim = int(head_dim * factor)
        base = params["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if rope_type not in ("linear", "llama3", "yarn"):
        raise ValueError(f"rope type {rope_type!r} is not supported (default, linear, llama3, yarn)")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    return inv_freq.float(), float(scale)


def rope_cos_sin(config: Any, max_positions: int, device: torch.device | str,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [max_positions, rotary_dim] in `dtype`, row p for absolute position p."""
    inv_freq, scale = rope_inv_freq(config)
    positions = torch.arange(max_positions, device=device)
    freqs = positions[:, None].float() * inv_freq.to(device=device, dtype=torch.float)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


@triton.jit
def _cos_sin(d, valid, pos, cos_ptr, sin_ptr, ROT_DIM: tl.constexpr):
    """The cos and sin (fp32) at position `pos` for dims `d` (the rotary store reads them before its wait: the
    rope table and the step's positions are host-fed, `pdl`)."""
    rotated = valid & (d < ROT_DIM)
    c = tl.load(cos_ptr + pos * ROT_DIM + d, mask=rotated, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * ROT_DIM + d, mask=rotated, other=0.0).to(tl.float32)
    return c, s


@triton.jit
def _rotate(row, d, valid, c, s, ROT_DIM: tl.constexpr):
    """One token's values at `row + d` (d: dims of each lane's head), rotated by `_cos_sin`'s c and s; d >= ROT_DIM
    pass through."""
    half = ROT_DIM // 2
    partner = tl.where(d < half, d + half, d - half)
    x = tl.load(row + d, mask=valid, other=0.0)
    dtype = x.dtype
    xp = tl.load(row + partner, mask=valid & (d < ROT_DIM), other=0.0).to(tl.float32)
    xr = tl.where(d < half, -xp, xp)  # rotate_half: (-x2, x1); negation is exact in any dtype
    a = (x.to(tl.float32) * c).to(dtype)
    b = (xr * s).to(dtype)
    y = (a.to(tl.float32) + b.to(tl.float32)).to(dtype)
    return tl.where(d < ROT_DIM, y, x)


@triton.jit
def _rotary_kernel(x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr, tok_stride, head_stride, n_heads,
                   HEAD_DIM: tl.constexpr, ROT_DIM: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # (waits first: the trainer's backward negates `sin` in the launch just before this one)
    pdl_enter(PDL)
    tok = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # flat over (head, dim) of one token
    valid = idx < n_heads * HEAD_DIM
    c, s = _cos_sin(idx % HEAD_DIM, valid, tl.load(pos_ptr + tok).to(tl.int64), cos_ptr, sin_ptr, ROT_DIM)
    row = x_ptr + tok * tok_stride + (idx // HEAD_DIM) * head_stride
    y = _rotate(row, idx % HEAD_DIM, valid, c, s, ROT_DIM)
    tl.store(out_ptr + tok * n_heads * HEAD_DIM + idx, y, mask=valid)


@triton.jit
def _rotary_store_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, slot_ptr, cos_ptr,
                         sin_ptr, q_tok_stride, q_head_stride, k_tok_stride, k_head_stride, v_tok_stride,
                         v_head_stride, n_heads, n_kv_heads, q_programs, HEAD_DIM: tl.constexpr,
                         ROT_DIM: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1)
    # the position, the slot and the rope table before the wait (host-fed: `pdl`), q, k and v after it
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    if pid < q_programs:  # the token's q heads, rotated into q_out
        idx = pid * BLOCK + tl.arange(0, BLOCK)
        valid = idx < n_heads * HEAD_DIM
        c, s = _cos_sin(idx % HEAD_DIM, valid, pos, cos_ptr, sin_ptr, ROT_DIM)
        pdl_enter(PDL)
        row = q_ptr + tok * q_tok_stride + (idx // HEAD_DIM) * q_head_stride
        y = _rotate(row, idx % HEAD_DIM, valid, c, s, ROT_DIM)
        tl.store(q_out_ptr + tok * n_heads * HEAD_DIM + idx, y, mask=valid)
    else:  # its k heads rotated, and its v heads as they are, into the caches at its slot
        idx = (pid - q_programs) * BLOCK + tl.arange(0, BLOCK)
        valid = idx < n_kv_heads * HEAD_DIM
        head, d = idx // HEAD_DIM, idx % HEAD_DIM
        at = tl.load(slot_ptr + tok).to(tl.int64) * n_kv_heads * HEAD_DIM + idx
        c, s = _cos_sin(d, valid, pos, cos_ptr, sin_ptr, ROT_DIM)
        pdl_enter(PDL)
        y = _rotate(k_ptr + tok * k_tok_stride + head * k_head_stride, d, valid, c, s, ROT_DIM)
        tl.store(k_cache_ptr + at, y, mask=valid)
        v = tl.load(v_ptr + tok * v_tok_stride + head * v_head_stride + d, mask=valid)
        tl.store(v_cache_ptr + at, v, mask=valid)


def _rotary_triton(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   block: int) -> torch.Tensor:
    # Positions are not range-checked on the GPU (that would synchronize): they must be < len(cos).
    require_triton(x)
    tokens, heads, head_dim = x.shape
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    if tokens > 0:
        grid = (tokens, triton.cdiv(heads * head_dim, block))
        launch(_rotary_kernel, grid, x, out, positions, cos, sin, x.stride(0), x.stride(1), heads, HEAD_DIM=head_dim,
               ROT_DIM=cos.shape[1], BLOCK=block, enable_fp_fusion=False, **pdl(x))
    return out


def _rotary_torch(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> torch.Tensor:
    rot = cos.shape[1]
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    xr, rest = x[..., :rot], x[..., rot:]
    y = xr * c + torch.cat((-xr[..., rot // 2:], xr[..., :rot // 2]), dim=-1) * s
    return y if rest.shape[-1] == 0 else torch.cat((y, rest), dim=-1)


def _rotary_store_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                         cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slots: torch.Tensor, block: int) -> torch.Tensor:
    # Slots are not range-checked on the GPU either: they must be < pages * page_size.
    require_triton(q)
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q_out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    if tokens > 0:
        q_programs = triton.cdiv(heads * head_dim, block)
        grid = (tokens, q_programs + triton.cdiv(kv_heads * head_dim, block))
        launch(_rotary_store_kernel, grid, q, k, v, q_out, k_cache, v_cache, positions, slots, cos, sin, q.stride(0),
               q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), heads, kv_heads, q_programs,
               HEAD_DIM=head_dim, ROT_DIM=cos.shape[1], BLOCK=block, enable_fp_fusion=False, **pdl(q))
    return q_out


def _check_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, block: int) -> None:
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2], \
        f"q, k must be [tokens, heads, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}"
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "q and k need a contiguous last dim"
    assert positions.shape == (q.shape[0],) and positions.dtype in INDEX_DTYPES, \
        f"positions must be [{q.shape[0]}] int32/int64, got {tuple(positions.shape)} {positions.dtype}"
    rot = cos.shape[1]
    assert cos.shape == sin.shape and cos.dim() == 2 and rot % 2 == 0 and rot <= q.shape[2], \
        f"cos/sin must be [positions, rotary_dim <= head_dim] with even rotary_dim, got {tuple(cos.shape)}"
    assert q.dtype == k.dtype == cos.dtype == sin.dtype, "q, k and the cos/sin table share the model dtype"
    assert len({t.device for t in (q, k, positions, cos, sin)}) == 1, "all tensors on one device"
    check_block(block)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, *, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """New (q, k): q [tokens, heads, head_dim], k [tokens, kv_heads, head_dim], positions [tokens]."""
    _check_rotary(q, k, positions, cos, sin, block)
    if use_triton(q):
        positions, cos, sin = positions.contiguous(), cos.contiguous(), sin.contiguous()
        return _rotary_triton(q, positions, cos, sin, block), _rotary_triton(k, positions, cos, sin, block)
    return _rotary_torch(q, positions, cos, sin), _rotary_torch(k, positions, cos, sin)


def rotary_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, *,
                 block: int) -> torch.Tensor:
    """`apply_rotary`'s new q; its new k, and v, written into the caches at `slots` as `store_kv` writes them.

    One launch on the GPU (the decode step's rotary and cache store, per layer), the same elementwise
    ops and roundings as the two calls; the CPU makes the two calls. Under PDL the kernel reads `positions`,
    `slots`, `cos` and `sin` before it waits for the launch before it (`pdl`): none may be that launch's output.
    """
    _check_rotary(q, k, positions, cos, sin, block)
    check_store(k, v, k_cache, v_cache, slots)
    if not use_triton(q):
        q, k = apply_rotary(q, k, positions, cos, sin, block=block)
        store_kv(k, v, k_cache, v_cache, slots)
        return q
    positions, cos, sin, slots = positions.contiguous(), cos.contiguous(), sin.contiguous(), slots.contiguous()
    return _rotary_store_triton(q, k, v, positions, cos, sin, k_cache, v_cache, slots, block)


def apply_rotary_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's own `apply_rotary_pos_emb` on the rotary part (tokens as the batch, unsqueeze_dim=1)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    rot = cos.shape[1]
    c, s = cos[positions.long()], sin[positions.long()]
    qr, kr = apply_rotary_pos_emb(q[..., :rot], k[..., :rot], c, s, unsqueeze_dim=1)
    return torch.cat((qr, q[..., rot:]), dim=-1), torch.cat((kr, k[..., rot:]), dim=-1)
