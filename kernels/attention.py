"""Paged, varlen, causal attention with split-KV at a fixed split size aligned to absolute positions.

Invariant kept: a query row at absolute position p reduces its keys in an order that depends only
on p and the selected (block_n, split_size) — never on the batch, the row's neighbours, or where
prefill stopped and decode began. Keys [j*S, (j+1)*S) form split j; inside a split, KV blocks of
block_n keys are visited from the split's start, each folded into a running (max, sum, out) with
the online-softmax update; a key after p is masked to -inf, which leaves the state bit-for-bit
untouched (alpha = exp(0) = 1, p = 0). Splits are then combined in order j = 0, 1, ... by one
kernel shared by prefill and decode (one split in a 16-row tile: the attention kernel does that
arithmetic itself, the same bits without a second launch or the fp32 partials). A tile of query
rows only adds blocks that are fully masked for its shorter rows, and a row's softmax sum is a dot
(the MMA's fixed order, see `paged_attention`), so a row's bits do not see the tile's height either:
the query tile (block_m, its warps) is a schedule, and decode may run 16-row tiles where prefill runs
64-row ones of the same KV width.

A tile's BLOCK_M rows are either BLOCK_M queries of one head, or (`pack` = the GQA group, as
FlashAttention-3's PackGQA) BLOCK_M // pack queries times the pack heads that share one KV head:
a decode step then reads each KV block once per KV head instead of once per query head. A row's
arithmetic is the same in both (the same tile shape, and every row of a tile is reduced alike), so
packing is a schedule, not a pin (tests/test_kernels_attention*.py compare the bits).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from detent_rl.kernels._triton import interpreting, pdl, pdl_enter, tl, triton
from detent_rl.kernels.attention_combine import combine_call, combine_kv_splits
from detent_rl.kernels.attention_cpu import attention_cpu
from detent_rl.kernels.attention_plan import plan_for
from detent_rl.kernels.launch import launch


@dataclass(frozen=True)
class AttnMeta:
    """Per-step metadata: requests' query spans, cached lengths, pages and query tiles."""
    cu_q: torch.Tensor  # int32 [B + 1], query rows of request b are cu_q[b]:cu_q[b+1]
    pos0: torch.Tensor  # int32 [B], absolute position of each request's first query
    token_pos: torch.Tensor  # int32 [T], absolute position of every query row
    block_table: torch.Tensor  # int32 [B, pages], page ids of each request's KV
    tile_req: torch.Tensor  # int32 [tiles], request of each query tile
    tile_q0: torch.Tensor  # int32 [tiles], first query row of each tile
    block_m: int
    pack: int = 1  # query heads per query in a tile's rows (1: one head per tile)
    # host copies of cu_q and pos0 where the builder had them (attn_meta): read without a device sync
    cu_q_host: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    pos0_host: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    # the split partials' buffers of the step's layers, shared by its no-grad `paged_attention` calls without `lse`:
    # a dict where the builder allows it (attn_meta's eager steps; not a captured graph's metadata)
    scratch: dict | None = field(default=None, compare=False, repr=False)

    @property
    def tile_queries(self) -> int:
        return self.block_m // self.pack


def pack_of(selection, num_heads: int, num_kv_heads: int) -> int:
    """The `pack` an attention selection asks for: the GQA group when it packs (`pack_gqa`)."""
    return num_heads // num_kv_heads if selection.pack_gqa else 1


def device_tensor(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A host list as a tensor on `device`, copied without waiting for the device's queue (a plain
    `torch.tensor(values, device=...)` synchronizes the stream: the CPU then stops running ahead). From
    pageable memory: a pinned copy measured no faster (H100 host, 300-2,000 ints; docs/BENCHMARKS.md, session 48)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def attn_meta(q_lens: list[int], cached: list[int], block_table: torch.Tensor, block_m: int,
              pack: int = 1, device: torch.device | str | None = None) -> AttnMeta:
    """Build the metadata on the host from the scheduler's lists, in one host tensor and one copy a step.
    `block_table` is on the device already, or a host tensor that rides in the same copy to `device`. Each
    array starts 16 bytes into the copy's block or a multiple of it: Triton specialises a pointer on that
    alignment, so an unaligned view would compile (and run) another variant."""
    assert len(q_lens) == len(cached) == block_table.shape[0]
    assert 1 <= pack <= block_m, f"a tile of {block_m} rows cannot pack {pack} heads"
    per = block_m // pack
    cu, pos, tiles_r, tiles_q = [0], [], [], []
    for b, (n, c) in enumerate(zip(q_lens, cached)):
        pos.extend(range(c, c + n))
        tiles_r.extend([b] * (-(-n // per)))
        tiles_q.extend(range(cu[-1], cu[-1] + n, per))
        cu.append(cu[-1] + n)
    dev = torch.device(device) if device is not None else block_table.device
    flat, spans = [], []
    for part in (cu, cached, pos, tiles_r, tiles_q):
        spans.append((len(flat), len(part)))
        flat.extend(part)
        flat.extend([0] * (-len(flat) % 4))  # 4 int32s: 16 bytes
    host = torch.tensor(flat, dtype=torch.int32)
    carried = block_table.device != dev
    if carried:
        host = torch.cat([host, block_table.to(torch.int32).reshape(-1)])
    d = host.to(dev, non_blocking=True)
    cu_t, pos0_t, pos_t, tr_t, tq_t = (d[at:at + n] for at, n in spans)
    table = d[len(flat):].view(block_table.shape) if carried else block_table.to(torch.int32)
    return AttnMeta(cu_t, pos0_t, pos_t, table, tr_t, tq_t, block_m, pack, cu_q_host=tuple(cu),
                    pos0_host=tuple(cached), scratch={})


@triton.jit
def _pages(bt_ptr, req, kpos, kmask, stride_bt, PAGE: tl.constexpr):
    """The pages of request `req` that hold positions `kpos` (0 where masked): the block table is host-fed, so a
    kernel may read it before its wait (`pdl_enter`; `pdl`)."""
    return tl.load(bt_ptr + req * stride_bt + kpos // PAGE, mask=kmask, other=0)


@triton.jit
def _kv_at(k_ptr, v_ptr, page, kvh, kpos, kmask, d, stride_kp, stride_ks, stride_kh, PAGE: tl.constexpr):
    """Keys and values at positions `kpos` in `page` (`_pages`; zeros where masked)."""
    off = page[:, None] * stride_kp + (kpos % PAGE)[:, None] * stride_ks + kvh * stride_kh + d[None, :]
    return tl.load(k_ptr + off, mask=kmask[:, None], other=0.0), tl.load(v_ptr + off, mask=kmask[:, None], other=0.0)


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cu_q_ptr, pos0_ptr, tile_req_ptr, tile_q0_ptr,
                      m_ptr, l_ptr, o_ptr, out_ptr, lse_ptr, scale, stride_qt, stride_qh, stride_kp, stride_ks,
                      stride_kh, stride_bt, stride_mt, stride_mh, stride_ot, stride_oh, stride_os, stride_outt,
                      stride_outh, stride_lh, split_len,
                      GROUP: tl.constexpr, PACK: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                      IEEE: tl.constexpr, UPCAST: tl.constexpr, PREFETCH: tl.constexpr, DIRECT: tl.constexpr,
                      LSE: tl.constexpr, TREE_SUM: tl.constexpr, PDL: tl.constexpr):
    # Everything up to the first KV block's pages is read before the wait (`pdl_enter`): the step's metadata and
    # block table are host-fed (`pdl`), so these dependent loads run while the predecessor does; q and the caches,
    # which it writes, are read after the wait. The same loads either way: bit-neutral.
    tile = tl.program_id(0)
    split = tl.program_id(2)
    req = tl.load(tile_req_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_begin = tl.load(cu_q_ptr + req)
    q_end = tl.load(cu_q_ptr + req + 1)
    pos0 = tl.load(pos0_ptr + req)
    r = tl.arange(0, BLOCK_M)
    if PACK == 1:  # program_id(1) is the query head; a row is a query
        head = tl.program_id(1) + 0 * r
        kvh = tl.program_id(1) // GROUP
        rows = q0 + r
        row_ok = rows < q_end
    else:  # program_id(1) is the KV head; row r is query r // PACK, head r % PACK of its group
        kvh = tl.program_id(1)
        head = kvh * GROUP + r % PACK
        rows = q0 + r // PACK
        row_ok = (rows < q_end) & (r < BLOCK_M // PACK * PACK)
    row_pos = pos0 + rows - q_begin
    last_pos = pos0 + tl.minimum(q0 + BLOCK_M // PACK, q_end) - 1 - q_begin
    span = split_len
    if SPLIT > 0:  # a pinned selection's one split size, compiled in (`paged_attention(fixed_split=)`)
        span = SPLIT
    lo = split * span
    hi = tl.minimum(lo + span, last_pos + 1)  # (no key when lo > last_pos: every mask below is off)
    first = lo + tl.arange(0, BLOCK_N)
    page = _pages(bt_ptr, req, first, first < hi, stride_bt, PAGE)  # the first block's
    if PREFETCH:  # and the second's, one block ahead of the loop (below)
        ahead = _pages(bt_ptr, req, first + BLOCK_N, first + BLOCK_N < hi, stride_bt, PAGE)
    pdl_enter(PDL)
    if lo <= last_pos:
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        ones = tl.full([BLOCK_N, 16], 1.0, v_ptr.dtype.element_ty)  # row sums as a dot: every column one row's
        if UPCAST:
            ones = ones.to(tl.float32)
        if PREFETCH:  # the next block's pages and keys are loaded while this block is reduced
            k, v = _kv_at(k_ptr, v_ptr, page, kvh, first, first < hi, d, stride_kp, stride_ks, stride_kh, PAGE)
            page = ahead
        for start in range(lo, hi, BLOCK_N):
            kpos = start + tl.arange(0, BLOCK_N)
            if PREFETCH:
                k_cur, v_cur = k, v
                # block start + BLOCK_N from the pages loaded one iteration ago; pages of start + 2 BLOCK_N
                nmask = kpos + BLOCK_N < hi
                k, v = _kv_at(k_ptr, v_ptr, page, kvh, kpos + BLOCK_N, nmask, d, stride_kp, stride_ks, stride_kh,
                              PAGE)
                page = _pages(bt_ptr, req, kpos + 2 * BLOCK_N, kpos + 2 * BLOCK_N < hi, stride_bt, PAGE)
            else:
                if start > lo:  # (the first block's pages came before the wait)
                    page = _pages(bt_ptr, req, kpos, kpos < hi, stride_bt, PAGE)
                k_cur, v_cur = _kv_at(k_ptr, v_ptr, page, kvh, kpos, kpos < hi, d, stride_kp, stride_ks, stride_kh,
                                      PAGE)
            if UPCAST:
                k_cur = k_cur.to(tl.float32)
                v_cur = v_cur.to(tl.float32)
            if IEEE:
                s = tl.dot(q, tl.trans(k_cur), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k_cur)) * scale
            s = tl.where(kpos[None, :] <= row_pos[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_safe)  # exactly 1 for a block fully masked for the row
            p = tl.exp(s - m_safe[:, None])  # exactly 0 where masked
            if TREE_SUM:  # the former row sum: a reduction tree the tile's layout shapes (the tests' control)
                row_sum = row_sum * alpha + tl.sum(p, 1)
            if IEEE:
                if not TREE_SUM:
                    row_sum = row_sum * alpha + tl.max(tl.dot(p, ones, input_precision="ieee"), 1)
                acc = acc * alpha[:, None] + tl.dot(p, v_cur, input_precision="ieee")
            else:
                w = p.to(v_cur.dtype)  # the weights the output sums, so the row sum sums them too
                if not TREE_SUM:
                    row_sum = row_sum * alpha + tl.max(tl.dot(w, ones), 1)
                acc = acc * alpha[:, None] + tl.dot(w, v_cur)
            m = m_new
        if DIRECT:  # one split: `_combine_kernel`'s arithmetic on it, here (see `paged_attention`)
            total = 0.0 + row_sum
            tl.store(out_ptr + rows[:, None] * stride_outt + head[:, None] * stride_outh + d[None, :],
                     ((0.0 + acc) / total[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
            if LSE:
                tl.store(lse_ptr + head * stride_lh + rows, m + tl.log(total), mask=row_ok)
        else:
            ml = rows * stride_mt + head * stride_mh + split
            tl.store(m_ptr + ml, m, mask=row_ok)
            tl.store(l_ptr + ml, row_sum, mask=row_ok)
            tl.store(o_ptr + rows[:, None] * stride_ot + head[:, None] * stride_oh + split * stride_os + d[None, :],
                     acc, mask=row_ok[:, None])

def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttnMeta, block_n: int,
           split_size: int) -> None:
    assert q.dim() == 3 and k_cache.dim() == 4 and k_cache.shape == v_cache.shape, \
        f"q [T, H, D] and caches [pages, page_size, KVH, D] expected, got {tuple(q.shape)}, {tuple(k_cache.shape)}"
    assert q.shape[2] == k_cache.shape[3] and q.shape[1] % k_cache.shape[2] == 0
    assert q.dtype == k_cache.dtype == v_cache.dtype and q.stride(2) == 1 and k_cache.stride(3) == 1
    assert split_size % block_n == 0, f"split_size {split_size} must be a multiple of block_n {block_n}"
    assert meta.token_pos.shape[0] == q.shape[0]
    assert meta.pack in (1, q.shape[1] // k_cache.shape[2]), \
        f"pack {meta.pack}: a tile packs 1 head or the GQA group of {q.shape[1] // k_cache.shape[2]}"


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttnMeta, *,
                    scale: float, block_n: int, split_size: int, num_splits: int, num_warps: int = 4,
                    num_stages: int = 2, prefetch: bool = False, lse: torch.Tensor | None = None,
                    combine: bool | None = None, tree_sum: bool = False, fixed_split: bool = False,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q [T, H, D] over the paged caches (which already hold the step's keys).
    `lse` (fp32 [H, T], GPU only) receives each row's log-sum-exp of its scaled scores, from the same
    split maxima and sums the output is divided by (the trainer's FlashAttention backward takes it).
    `prefetch` loads each KV block's pages and keys one iteration ahead, in registers, so that a
    split's chain of blocks is not one dependent pair of loads (page id, then key) after another: the
    same arithmetic in the same order, a schedule (the selection's `kv_prefetch`; tests compare both).

    With one split and 16-row query tiles (the decode tile) the attention kernel writes the output (and
    `lse`) itself, from the same operations the combine does on one split: its weight is exp(m - m) = 1,
    its sums start at +0 (0 + x * 1 is x, and turns a -0 into +0), then the same division and log. That
    saves the combine's launch and the fp32 partials. In 64-row tiles the same epilogue slowed the
    kernel by more than it saved (H200, Qwen2-0.5B heads, batch-256 decode: 29.2 against 20.4 µs a
    layer; docs/BENCHMARKS.md), so those keep the combine. `combine` forces one path (True: the
    combine kernel; False: the kernel's own epilogue), for the tests that compare their bits.

    `fixed_split`: `split_size` is the caller's one split size for every call (a pinned selection's), so the
    kernels take it compiled in (a constexpr: one variant; the split's bounds and the combine's split count by
    shifts). False passes it at run time, for a selection whose size follows the batch (the stock arm's split
    heuristic), which would otherwise compile a variant per size inside an online serve. The same split
    boundaries either way, so the same arithmetic (tests compare both). The run-time size cost the pinned 0.5B
    batch-1 decode step 10-12 µs on an H100 (docs/BENCHMARKS.md, session 53's bisection).

    A row's softmax sum is taken on the tensor cores, as a dot of the block's weights with a column of
    ones: an MMA sums each output element over k in the order the instruction fixes, whatever the tile's
    height and its warps (as the GEMM's rows, tests/test_kernels_matmul_gpu.py), so the query tile is a
    schedule. `tl.sum` instead reduces in a tree the tile's layout shapes: a 16-row tile (`mma.sync`, a
    row's keys over four warps, summed through shared memory) and a 64-row one (a warpgroup MMA, a row's
    keys in one warp) round some rows differently. In bf16 the dot sums the bf16 weights the output's
    dot sums (p rounded once), so the normaliser is the numerator's own. `tree_sum` runs the former
    `tl.sum` (the tests' control, and the stock arm's sum in 128-key tiles, where it is faster); the CPU
    path has the one arithmetic. `out`: the [T, H, D] tensor to write into (a view of a larger buffer: the
    rows a step's graphed pieces read, `rollout/step_graphs.py`); a new one by default. Under PDL the kernels
    read `meta`'s tensors before they wait for the launch before them (`pdl`): none may be that launch's output."""
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(2) != 1:
        raise ValueError(f"attention out: {tuple(out.shape)} {out.dtype} on {out.device} with strides "
                         f"{out.stride()} does not take q's {tuple(q.shape)} {q.dtype} on {q.device} rows")
    direct = num_splits == 1 and (meta.block_m <= 16 if combine is None else not combine)
    opts = pdl(q)
    plan = None
    if q.is_cuda and lse is None and q.numel() and not interpreting():  # a recorded call shape: checked (its key)
        plan = plan_for(q, k_cache, v_cache, meta, out, (scale, block_n, split_size, num_splits, num_warps,
                                                         num_stages, prefetch, tree_sum, opts["PDL"], fixed_split,
                                                         direct))
    if plan is None or not plan.ready:
        _check(q, k_cache, v_cache, meta, block_n, split_size)
    T, H, D = q.shape
    if T == 0:
        return out
    if not (q.is_cuda or interpreting()):
        assert lse is None, "the log-sum-exp output is the Triton kernel's"
        return attention_cpu(q, k_cache, v_cache, meta, scale, block_n, split_size, out)
    assert lse is None or (lse.shape == (H, T) and lse.dtype == torch.float32 and lse.stride(1) == 1)
    if direct:  # placeholders, never read
        m = lsum = o = out
    else:
        shared = meta.scratch if lse is None and not torch.is_grad_enabled() else None  # (no-grad steps only)
        m, lsum, o = shared.get((H, D, num_splits, q.device), (None,) * 3) if shared is not None else (None,) * 3
        if m is None:
            m = torch.empty((T, H, num_splits), dtype=torch.float32, device=q.device)
            lsum = torch.empty_like(m)
            o = torch.empty((T, H, num_splits, D), dtype=torch.float32, device=q.device)
            if shared is not None:
                shared[H, D, num_splits, q.device] = (m, lsum, o)
    tensors = dict(q=q, k=k_cache, v=v_cache, bt=meta.block_table, cu=meta.cu_q, pos0=meta.pos0, tr=meta.tile_req,
                   tq=meta.tile_q0, m=m, l=lsum, o=o, out=out, tp=meta.token_pos)
    if plan is not None and plan.ready and plan.replay(tensors, split_size, fixed_split):
        return out
    grid = (meta.tile_req.shape[0], H if meta.pack == 1 else k_cache.shape[2], num_splits)
    args = (q, k_cache, v_cache, meta.block_table, meta.cu_q, meta.pos0, meta.tile_req, meta.tile_q0, m, lsum, o,
            out, lse if lse is not None else out, scale, q.stride(0), q.stride(1), k_cache.stride(0),
            k_cache.stride(1), k_cache.stride(2), meta.block_table.stride(0), m.stride(0), m.stride(1), o.stride(0),
            o.stride(1), o.stride(2), out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
            split_size)
    kwargs = dict(GROUP=H // k_cache.shape[2], PACK=meta.pack, PAGE=k_cache.shape[1], HEAD_DIM=D, BLOCK_M=meta.block_m,
                  BLOCK_N=block_n, SPLIT=split_size if fixed_split else 0, IEEE=q.dtype == torch.float32,
                  UPCAST=interpreting() and q.dtype != torch.float32, PREFETCH=prefetch, DIRECT=direct,
                  LSE=lse is not None, TREE_SUM=tree_sum, num_warps=num_warps, num_stages=num_stages)
    launch(_attention_kernel, grid, *args, **kwargs, **pdl(q))
    if not direct:
        combine_kv_splits(m, lsum, o, out, meta.token_pos, lse, split_size, fixed_split)
    if plan is not None:  # the two launches just made
        call = None if direct else combine_call(m, lsum, o, out, meta.token_pos, lse, split_size,
                                                       fixed_split)
        plan.record((_attention_kernel, grid, args, dict(kwargs, **opts)), call, tensors)
    return out


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos0: int, scale: float) -> torch.Tensor:
    """fp32 causal attention of one request: q [n, H, D] at positions pos0.., k/v [pos0 + n, KVH, D]."""
    n, H, D = q.shape
    group = H // k.shape[1]
    kk = k.float().repeat_interleave(group, 1).transpose(0, 1)
    vv = v.float().repeat_interleave(group, 1).transpose(0, 1)
    s = torch.matmul(q.float().transpose(0, 1), kk.transpose(1, 2)) * scale
    causal = torch.arange(k.shape[0])[None, :] <= (pos0 + torch.arange(n))[:, None]
    s = s.masked_fill(~causal.to(s.device), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), vv).transpose(0, 1).to(q.dtype)
