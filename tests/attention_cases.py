"""Shared scenario builder for the attention invariance tests (CPU and GPU)."""
from __future__ import annotations

import random

import torch

from detent_rl.kernels.attention import attn_meta, pack_of, paged_attention
from detent_rl.kernels.kv_store import store_kv
from detent_rl.kernels.programs.attention import attention_program
from detent_rl.selir.cache import JITCache
from detent_rl.selir.solver import solve

FACTS = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "num_sms": 132, "page_size": 16,
         "max_context": 512, "max_batch": 64, "max_num_tokens": 2048, "smem_bytes": 227 * 1024,
         "dtype_bytes": 2}


def selections(facts: dict = FACTS, split_size: int = 128):
    sol = solve(attention_program, facts, cache=JITCache(enabled=False))
    pins = {"split_size": split_size, "num_splits": -(-facts["max_context"] // split_size)}
    return sol.stock(), sol.commit(pins)


class Requests:
    """Random per-position q/k/v of several requests, and a paged cache holding their keys."""

    def __init__(self, lengths: list[int], facts: dict, dtype: torch.dtype, device: str, seed: int = 0) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        H, KVH, D, P = facts["num_heads"], facts["num_kv_heads"], facts["head_dim"], facts["page_size"]
        self.lengths, self.P, self.dtype, self.device = lengths, P, dtype, device
        self.q = [torch.randn(n, H, D, generator=g).to(dtype).to(device) for n in lengths]
        self.k = [torch.randn(n, KVH, D, generator=g).to(dtype).to(device) for n in lengths]
        self.v = [torch.randn(n, KVH, D, generator=g).to(dtype).to(device) for n in lengths]
        pages = [-(-n // P) for n in lengths]
        ids = list(range(sum(pages)))
        random.Random(seed).shuffle(ids)  # pages scattered over the pool
        self.tables, at = [], 0
        for n in pages:
            self.tables.append(ids[at:at + n])
            at += n
        self.k_cache = torch.zeros(sum(pages) + 1, P, KVH, D, dtype=dtype, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        for r, n in enumerate(lengths):  # every position's key is written once, before it is read
            slots = torch.tensor([self.tables[r][p // P] * P + p % P for p in range(n)], device=device)
            store_kv(self.k[r], self.v[r], self.k_cache, self.v_cache, slots)
        self.scale = D ** -0.5
        self.pack: int | None = None  # None: what the selection asks for; 1 or the group: forced
        self.prefetch = True  # the kernel's KV prefetch (a schedule)
        self.keep_lse = False  # ask the kernel for each row's log-sum-exp ([H, T], into `self.lse`)
        self.combine: bool | None = None  # one split: None as paged_attention decides; True/False forced
        self.lse: torch.Tensor | None = None
        self.tree_sum = False  # the kernel's former row sum (`tl.sum`): the query-tile tests' control
        self.fixed_split = False  # the split size compiled in, as the pinned arms run it (a schedule)

    def step(self, spans: list[tuple[int, int, int]], sel) -> list[torch.Tensor]:
        """One engine step: spans of (request, first position, count); returns each span's rows."""
        width = max(len(self.tables[r]) for r, _, _ in spans)
        table = torch.zeros(len(spans), width, dtype=torch.int32)
        for i, (r, _, _) in enumerate(spans):
            table[i, :len(self.tables[r])] = torch.tensor(self.tables[r])
        q = torch.cat([self.q[r][p:p + n] for r, p, n in spans])
        cfg = sel(len(spans), max(n for _, _, n in spans), q.shape[0], max(p + n for _, p, n in spans))
        pack = pack_of(cfg, self.q[0].shape[1], self.k[0].shape[1]) if self.pack is None else self.pack
        meta = attn_meta([n for _, _, n in spans], [p for _, p, _ in spans], table.to(self.device), cfg.block_m,
                         pack)
        self.lse = torch.empty(q.shape[1], q.shape[0], device=self.device) if self.keep_lse else None
        out = paged_attention(q, self.k_cache, self.v_cache, meta, scale=self.scale, block_n=cfg.block_n,
                              split_size=cfg.split_size, num_splits=cfg.num_splits, num_warps=cfg.num_warps,
                              num_stages=2, prefetch=self.prefetch, lse=self.lse, combine=self.combine,
                              tree_sum=self.tree_sum, fixed_split=self.fixed_split)
        rows, at = [], 0
        for _, _, n in spans:
            rows.append(out[at:at + n])
            at += n
        return rows


def scenario_outputs(reqs: Requests, target: int, sel, seed: int) -> dict[str, torch.Tensor]:
    """The target request's rows computed five ways: trainer prefill, prefill + decode, chunked
    prefill, inside a mixed batch at a random row, and after a prefix-cache hit."""
    n = reqs.lengths[target]
    others = [r for r in range(len(reqs.lengths)) if r != target]
    rng = random.Random(seed)
    out = {"prefill": reqs.step([(target, 0, n)], sel)[0]}
    prompt = max(1, n // 3)
    rows = [reqs.step([(target, 0, prompt)], sel)[0]]
    rows += [reqs.step([(target, p, 1)], sel)[0] for p in range(prompt, n)]
    out["prefill+decode"] = torch.cat(rows)
    rows, p = [], 0
    while p < n:
        c = min(n - p, rng.choice([1, 3, 17, 40]))
        rows.append(reqs.step([(target, p, c)], sel)[0])
        p += c
    out["chunked"] = torch.cat(rows)
    spans = [(r, 0, reqs.lengths[r]) for r in others]
    slot = rng.randrange(len(spans) + 1)
    spans.insert(slot, (target, 0, n))
    out["mixed batch"] = reqs.step(spans, sel)[slot]
    hit = rng.randrange(1, n)  # prefix cache: the first `hit` keys were cached by another request
    out["prefix hit"] = torch.cat([out["prefill"][:hit], reqs.step([(target, hit, n - hit)], sel)[0]])
    return out


def mismatches(out: dict[str, torch.Tensor]) -> list[str]:
    ref = out["prefill"]
    bad = []
    for name, rows in out.items():
        diff = (rows != ref).reshape(rows.shape[0], -1).any(1).nonzero().flatten().tolist()
        if diff:
            bad.append(f"{name}: positions {diff[:6]}{'...' if len(diff) > 6 else ''} differ from one-shot prefill")
    return bad
