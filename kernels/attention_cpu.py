"""`paged_attention`'s CPU path: the attention kernel's reduction structure in PyTorch (splits of the selected size,
KV blocks in order from each split's start, the online-softmax update, the splits combined in order), on
fixed-shape tiles, so that its rows' bits do not see the batch either."""
from __future__ import annotations

import torch


CPU_ROWS = 64  # the CPU path's tile height, whatever the selection's: CPU matmuls read M


def _cpu_tiles(meta, cu: list[int]):
    """(request, first query, queries) of each CPU tile: the selection's tiles cut into CPU_ROWS queries."""
    for req, q0 in zip(meta.tile_req.tolist(), meta.tile_q0.tolist()):
        end = q0 + min(meta.tile_queries, cu[req + 1] - q0)  # a packed tile's queries, each on its heads' rows
        for c0 in range(q0, end, CPU_ROWS):
            yield req, c0, min(CPU_ROWS, end - c0)


def attention_cpu(q, k_cache, v_cache, meta, scale, block_n, split_size, out):
    """The same reduction structure in PyTorch, on fixed-shape tiles of CPU_ROWS queries and all heads
    (CPU matmul reads M otherwise), so the query tile is a schedule here too."""
    T, H, D = q.shape
    kvh, page = k_cache.shape[2], k_cache.shape[1]
    group, bm = H // kvh, CPU_ROWS
    cu, pos0 = meta.cu_q.tolist(), meta.pos0.tolist()
    ns = int(meta.token_pos.max().item()) // split_size + 1
    m = torch.full((T, H, ns), float("-inf"))
    lsum = torch.zeros((T, H, ns))
    o = torch.zeros((T, H, ns, D))
    for req, q0, n_rows in _cpu_tiles(meta, cu):
        qt = torch.zeros((bm, H, D))
        qt[:n_rows] = q[q0:q0 + n_rows].float()
        qt = qt.transpose(0, 1)  # [H, BM, D]
        row_pos = torch.arange(bm) + pos0[req] + q0 - cu[req]
        last = pos0[req] + q0 + n_rows - 1 - cu[req]
        pages = meta.block_table[req].tolist()
        for j in range(last // split_size + 1):
            lo, hi = j * split_size, min((j + 1) * split_size, last + 1)
            mj = torch.full((H, bm), float("-inf"))
            lj = torch.zeros((H, bm))
            aj = torch.zeros((H, bm, D))
            for start in range(lo, hi, block_n):
                kpos = torch.arange(start, start + block_n)
                valid = kpos < hi
                idx = kpos.clamp(max=hi - 1)
                slots = torch.tensor([pages[p // page] for p in idx.tolist()]) * page + idx % page
                k = k_cache.reshape(-1, kvh, D)[slots].float() * valid[:, None, None]
                v = v_cache.reshape(-1, kvh, D)[slots].float() * valid[:, None, None]
                k = k.transpose(0, 1).repeat_interleave(group, 0)  # [H, BN, D]
                v = v.transpose(0, 1).repeat_interleave(group, 0)
                s = torch.bmm(qt, k.transpose(1, 2)) * scale  # [H, BM, BN] on fixed shapes
                s = torch.where(kpos[None, None, :] <= row_pos[None, :, None], s, float("-inf"))
                m_new = torch.maximum(mj, s.amax(-1))
                m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
                alpha = torch.exp(mj - m_safe)
                p = torch.exp(s - m_safe[..., None])
                pv = p if q.dtype == torch.float32 else p.to(q.dtype).float()  # the weights the output sums
                lj = lj * alpha + pv.sum(-1)
                aj = aj * alpha[..., None] + torch.bmm(pv, v)
                mj = m_new
            rows = slice(q0, q0 + n_rows)
            m[rows, :, j] = mj[:, :n_rows].t()
            lsum[rows, :, j] = lj[:, :n_rows].t()
            o[rows, :, j] = aj[:, :n_rows].transpose(0, 1)
    n = (meta.token_pos.long() // split_size + 1)[:, None]  # [T, 1] splits per row
    mx = m[:, :, 0].clone()
    for j in range(1, ns):
        mx = torch.where(j < n, torch.maximum(mx, m[:, :, j]), mx)
    total = torch.zeros((T, H))
    acc = torch.zeros((T, H, D))
    for j in range(ns):  # splits in order; rows with fewer splits keep their values exactly
        w = torch.exp(m[:, :, j] - mx)
        total = torch.where(j < n, total + lsum[:, :, j] * w, total)
        acc = torch.where((j < n)[..., None], acc + o[:, :, j] * w[..., None], acc)
    out.copy_((acc / total[..., None]).to(out.dtype))
    return out
