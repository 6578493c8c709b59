"""SGLang's own Triton decode attention on a batch of requests, under a split selection — SGLang's
stock heuristic, its deterministic mode's fixed tile, or the DETENT plugin's pinned tile — for the
GPU test (tests/test_sglang_gpu.py) and the benchmark (bench/sglang_kernels_bench.py).

A backend here is the handful of TritonAttnBackend fields its split selection reads, set as SGLang's
`__init__` sets them on each path (deterministic: `split_tile_size` 256 and `max_kv_splits =
ceil(context / 256)`; stock: 8 split buffers and the SM count), and, for the pinned arm, as the
plugin's own `pin_backend` hook leaves them. The split counts come from SGLang's
`TritonAttnBackend.get_num_kv_splits` (stock and deterministic) or the plugin's
`pinned_num_kv_splits`, and the attention from SGLang's `decode_attention_fwd`.
"""
from __future__ import annotations

import random
from itertools import accumulate
from types import SimpleNamespace
from typing import Callable

import torch

DETERMINISTIC_TILE = 256  # SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE's default in SGLang 0.5.23
STOCK_MAX_KV_SPLITS = 8  # --triton-attention-num-kv-splits' default


def backend_fields(**kw) -> SimpleNamespace:
    """The fields of a TritonAttnBackend that its split selection reads (by default a 32-head, 4-KV-head
    model, 40,960-token context, on 132 SMs), as SGLang's __init__ leaves them outside deterministic mode;
    `kw` overrides them."""
    return SimpleNamespace(**{"num_head": 32, "num_kv_head": 4, "max_kv_splits": STOCK_MAX_KV_SPLITS,
                              "device_core_count": 132, "max_context_len": 40960, "use_mla": False,
                              "static_kv_splits": False, "enable_deterministic": False, "split_tile_size": None,
                              "enable_lean_attention": None, **kw})


def backend(arm: str, *, num_head: int, num_kv_head: int, context: int, sms: int, tile: int = 256):
    """(backend fields, split-count function) of one arm: "stock", "deterministic" or "detent"."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from detent_rl.rollout import sglang_plugin as P
    be = backend_fields(num_head=num_head, num_kv_head=num_kv_head, device_core_count=sms, max_context_len=context)
    if arm == "stock":
        return be, TritonAttnBackend.get_num_kv_splits
    if arm == "deterministic":
        be.enable_deterministic, be.split_tile_size = True, DETERMINISTIC_TILE
        be.max_kv_splits = -(-context // DETERMINISTIC_TILE)
        return be, TritonAttnBackend.get_num_kv_splits
    if arm == "detent":
        _pin(be, tile)
        return be, P.pinned_num_kv_splits
    raise ValueError(f"unknown arm {arm!r}; expected stock, deterministic or detent")


def _pin(be, tile: int) -> None:
    """The plugin's hook on these backend fields, with `tile` as the tuple's split tile (the plugin's
    module state restored after)."""
    from detent_rl.rollout import sglang_plugin as P
    before = P._STATE["tile"]
    P._STATE["tile"] = tile
    try:
        P.pin_backend(None, be)
    finally:
        P._STATE["tile"] = before


class Batch:
    """Requests of given KV lengths: keys and values scattered over one token pool (as SGLang's
    allocator leaves them), one query per request."""

    def __init__(self, lens: list[int], *, num_head: int, num_kv_head: int, dim: int, dtype: torch.dtype,
                 device: str, seed: int = 0) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.lens, self.dim, self.device = lens, dim, device
        pool = sum(lens)
        self.k = torch.randn(pool, num_kv_head, dim, generator=g).to(dtype).to(device)
        self.v = torch.randn(pool, num_kv_head, dim, generator=g).to(dtype).to(device)
        perm = torch.randperm(pool, generator=g)
        self.tokens, at = [], 0
        for n in lens:
            self.tokens.append(perm[at:at + n].to(device))
            at += n
        self.q = torch.randn(len(lens), num_head, dim, generator=g).to(dtype).to(device)

    def inputs(self, rows: list[int], be) -> dict:
        """decode_attention_fwd's tensors for the requests `rows`, in that order (splits not yet chosen)."""
        ls = [self.lens[r] for r in rows]
        dev = self.device
        indptr = torch.tensor([0] + [sum(ls[:i + 1]) for i in range(len(ls))], dtype=torch.int32, device=dev)
        heads = self.q.shape[1]
        return dict(q=self.q[rows].contiguous(), indptr=indptr,
                    indices=torch.cat([self.tokens[r] for r in rows]).to(torch.int32),
                    seq_lens=torch.tensor(ls, dtype=torch.int32, device=dev),
                    splits=torch.zeros(len(rows), dtype=torch.int32, device=dev),
                    logits=torch.zeros(len(rows), heads, be.max_kv_splits, self.dim, dtype=torch.float32, device=dev),
                    lse=torch.zeros(len(rows), heads, be.max_kv_splits, dtype=torch.float32, device=dev),
                    o=torch.zeros(len(rows), heads, self.dim, dtype=self.q.dtype, device=dev))

    def step(self, x: dict, be, select: Callable) -> Callable[[], None]:
        """One decode step's work as SGLang runs it: the split counts, then the attention."""
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

        def run() -> None:
            select(be, x["splits"], x["seq_lens"])
            decode_attention_fwd(x["q"], self.k, self.v, x["o"], x["indptr"], x["indices"], x["logits"], x["lse"],
                                 x["splits"], be.max_kv_splits, self.dim ** -0.5, 1.0, 1.0)
        return run

    def row(self, target: int, rows: list[int], be, select: Callable) -> tuple[torch.Tensor, int]:
        """Request `target`'s output row and split count when decoded among `rows`."""
        x = self.inputs(rows, be)
        self.step(x, be, select)()
        i = rows.index(target)
        return x["o"][i].clone(), int(x["splits"][i].item())


def compositions(n: int, target: int, seed: int = 0) -> list[list[int]]:
    """Batches that hold request `target` of n: alone, with a few neighbours, with all, at other rows."""
    rng = random.Random(seed)
    others = [r for r in range(n) if r != target]
    out = [[target]]
    for k in (1, 3, 7, 31, 63, 255):
        if k <= len(others):
            rows = rng.sample(others, k)
            rows.insert(rng.randrange(k + 1), target)
            out.append(rows)
    out.append(list(range(n)))
    return out


def sglang_rollout_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int], prompts: list[int], *,
                        tile: int, context: int, seed: int = 0) -> torch.Tensor:
    """Every row of packed sequences as SGLang's Triton backend computes them in a rollout under the
    plugin: the prompts prefilled by the unified extend kernel in chunks (the first prompt in two, the
    second chunk batched with the other prompts, each chunk after its cached prefix), then one decode
    step per completion token, each sequence's row decoded among the other live sequences and a random
    number of unrelated requests, its split count the plugin's. The keys sit scattered in a token pool
    (with the unrelated requests' keys), as SGLang's allocator leaves them."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified
    g = torch.Generator(device="cpu").manual_seed(seed)
    rng = random.Random(seed)
    dev, T, H, D = q.device, q.shape[0], q.shape[1], q.shape[2]
    extra = 3 * context // 4  # keys of the unrelated requests
    pool_k = torch.randn(T + extra, *k.shape[1:], generator=g).to(k.dtype).to(dev)
    pool_v = torch.randn(T + extra, *v.shape[1:], generator=g).to(v.dtype).to(dev)
    slot = torch.randperm(T + extra, generator=g).to(dev)[:T]  # token t's key at pool row slot[t]
    pool_k[slot], pool_v[slot] = k, v
    free = sorted(set(range(T + extra)) - set(slot.tolist()))
    i32 = dict(dtype=torch.int32, device=dev)
    out = torch.full_like(q, float("nan"))
    scale = D ** -0.5

    def extend(chunks: list[tuple[int, int, int]]) -> None:  # (sequence start, prefix, chunk length)
        rows = torch.cat([torch.arange(a + pre, a + pre + n, device=dev) for a, pre, n in chunks])
        kv = [slot[a:a + pre + n] for a, pre, n in chunks]
        o = torch.empty((rows.shape[0], H, D), dtype=q.dtype, device=dev)
        extend_attention_fwd_unified(
            q[rows].contiguous(), o, pool_k, pool_v, 1.0, 1.0,
            torch.tensor([0] + list(accumulate([n for _, _, n in chunks])), **i32),
            torch.tensor([0] + list(accumulate([pre + n for _, pre, n in chunks])), **i32),
            torch.cat(kv).to(torch.int32), torch.tensor([pre for _, pre, _ in chunks], **i32),
            max(n for _, _, n in chunks), sm_scale=scale, is_causal=True)
        out[rows] = o

    first = max(1, prompts[0] // 2)
    extend([(cu[0], 0, first)])
    extend([(cu[0], first, prompts[0] - first)] + [(a, 0, p) for a, p in zip(cu[1:-1], prompts[1:])])
    be, select = backend("detent", num_head=H, num_kv_head=k.shape[1], context=context, sms=132, tile=tile)
    step = 0
    while True:
        live = [(a + p + step, a) for a, b, p in zip(cu, cu[1:], prompts) if a + p + step < b]
        if not live:
            break
        others = [sorted(rng.sample(free, rng.randint(1, min(len(free), context // 2))))
                  for _ in range(rng.randint(0, 5))]
        kv = [slot[a:r + 1] for r, a in live] + [torch.tensor(o, device=dev) for o in others]
        order = list(range(len(kv)))
        rng.shuffle(order)  # the sequences' rows land anywhere in the batch
        kv = [kv[i] for i in order]
        queries = torch.cat([q[[r for r, _ in live]], torch.randn(len(others), H, D, generator=g).to(q.dtype).to(dev)])
        queries = queries[order]
        lens = torch.tensor([len(x) for x in kv], **i32)
        splits = torch.empty(len(kv), **i32)
        select(be, splits, lens)
        logits = torch.empty((len(kv), H, be.max_kv_splits, D), dtype=torch.float32, device=dev)
        lse = torch.empty((len(kv), H, be.max_kv_splits), dtype=torch.float32, device=dev)
        o = torch.empty((len(kv), H, D), dtype=q.dtype, device=dev)
        indptr = torch.tensor([0] + list(accumulate(lens.tolist())), **i32)
        decode_attention_fwd(queries.contiguous(), pool_k, pool_v, o, indptr, torch.cat(kv).to(torch.int32), logits,
                             lse, splits, be.max_kv_splits, scale, 1.0, 1.0)
        for j, i in enumerate(order):
            if i < len(live):
                out[live[i][0]] = o[j]
        step += 1
    return out

