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
from types import SimpleNamespace
from typing import Callable

import torch

DETERMINISTIC_TILE = 256  # SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE's default in SGLang 0.5.23
STOCK_MAX_KV_SPLITS = 8  # --triton-attention-num-kv-splits' default


def backend(arm: str, *, num_head: int, num_kv_head: int, context: int, sms: int, tile: int = 256):
    """(backend fields, split-count function) of one arm: "stock", "deterministic" or "detent"."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from detent_rl.rollout import sglang_plugin as P
    be = SimpleNamespace(num_head=num_head, num_kv_head=num_kv_head, max_kv_splits=STOCK_MAX_KV_SPLITS,
                         device_core_count=sms, max_context_len=context, use_mla=False, static_kv_splits=False,
                         enable_deterministic=False, split_tile_size=None)
    if arm == "stock":
        return be, TritonAttnBackend.get_num_kv_splits
    if arm == "deterministic":
        be.enable_deterministic, be.split_tile_size = True, DETERMINISTIC_TILE
        be.max_kv_splits = -(-context // DETERMINISTIC_TILE)
        return be, TritonAttnBackend.get_num_kv_splits
    if arm == "detent":
        P._STATE["tile"] = tile
        P.pin_backend(None, be)
        return be, P.pinned_num_kv_splits
    raise ValueError(f"unknown arm {arm!r}; expected stock, deterministic or detent")


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
