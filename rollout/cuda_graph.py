"""CUDA graphs of the decode step: one new token per sequence, the batch padded to a captured size.

A decode step launches a few hundred small kernels; eager launches cost ~10 us each, a graph
replay ~1 us. One graph is captured per padded batch size (on first use), over static input
buffers that every replay refills: token ids, positions, cache slots, page tables.

Why padding cannot change a request's bits: a graph replays the kernels with the parameters the
selectors returned at capture, for the padded size. That is sound only when selection does not
read the batch — the pinned arms (detent, det). Capture refuses a selection that still does
(the stock arm); the engine then runs decode eagerly. With the selection pinned, every kernel
reduces a row the same way whatever the rows beside it, so the padded rows — which read and
write one scratch page and are discarded — change nothing, and a graph's logits equal the eager
step's bit for bit (tests/test_engine.py checks it on the GPU).
"""
from __future__ import annotations

import torch

from detent_rl.kernels.attention import AttnMeta
from detent_rl.models.context import ForwardContext, KVCache, set_context
from detent_rl.models.model import CausalLM


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch (and max_batch itself)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


class DecodeGraphs:
    """Decode-step graphs of `model` over `caches`; rows past the batch use page `scratch_page`."""

    def __init__(self, model: CausalLM, caches: list[KVCache], scratch_page: int, max_batch: int) -> None:
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got device {model.device}")
        if not 0 <= scratch_page < caches[0][0].shape[0]:
            raise ValueError(f"scratch page {scratch_page} is outside the cache's {caches[0][0].shape[0]} pages")
        if model.selections.arm == "stock":
            raise ValueError("decode graphs need a pinned arm (detent or det): the stock arm's selections read "
                             "the batch, and a replay would reuse the captured batch's kernels")
        d = model.selections.deployment
        self.model, self.caches, self.scratch = model, caches, scratch_page
        self.max_context = d.max_context
        self.max_pages = -(-d.max_context // model.page_size)
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        for b in self.sizes:  # refuse before anything is captured, naming what reads the batch
            self._check_pinned(b)
        dev, B = model.device, self.max_batch
        self.input_ids = torch.zeros(B, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(B, dtype=torch.int32, device=dev)
        self.slots = torch.zeros(B, dtype=torch.int64, device=dev)
        self.block_table = torch.full((B, self.max_pages), scratch_page, dtype=torch.int32, device=dev)
        self.cu_q = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(B, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def _check_pinned(self, b: int) -> None:
        m = self.model
        if m.select_attention(b, 1, b, 1) != m.select_attention(b, 1, b, self.max_context):
            raise ValueError(f"decode graphs need pinned selections: the {m.selections.arm} arm's attention "
                             f"selection at batch {b} reads the KV length")

    def size_for(self, n: int) -> int:
        for b in self.sizes:
            if b >= n:
                return b
        raise ValueError(f"a decode batch of {n} exceeds the largest captured size {self.max_batch}")

    def _context(self, b: int) -> ForwardContext:
        block_m = self.model.select_attention(b, 1, b, self.max_context).block_m
        pos = self.positions[:b]
        meta = AttnMeta(cu_q=self.cu_q[:b + 1], pos0=pos, token_pos=pos, block_table=self.block_table[:b],
                        tile_req=self.rows[:b], tile_q0=self.rows[:b], block_m=block_m)
        return ForwardContext(meta=meta, slots=self.slots[:b], kv_caches=self.caches, num_seqs=b, max_seqlen_q=1,
                              max_seqlen_k=self.max_context)

    def _forward(self, b: int) -> torch.Tensor:
        with set_context(self._context(b)):
            hidden = self.model(self.input_ids[:b], self.positions[:b])
        return self.model.logits(hidden)

    def _capture(self, b: int) -> None:
        self._pad(0, b)
        for _ in range(2):  # compile every Triton variant of this size outside the capture
            self._forward(b)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[b] = self._forward(b)
        self.graphs[b] = graph

    def _pad(self, n: int, b: int) -> None:
        """Rows n..b-1: token 0 at position 0 in the scratch page."""
        if n < b:
            self.input_ids[n:b] = 0
            self.positions[n:b] = 0
            self.slots[n:b] = self.scratch * self.model.page_size
            self.block_table[n:b] = self.scratch

    @torch.inference_mode()
    def run(self, tokens: list[int], positions: list[int], slots: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Logits [n, vocab] of one decode step: token i at `positions[i]` written to `slots[i]`,
        attending over the pages `tables[i]`. The returned tensor is overwritten by the next replay."""
        n = len(tokens)
        if not n == len(positions) == len(slots) == len(tables):
            raise ValueError("tokens, positions, slots and page tables must have one entry per sequence")
        longest = max(len(t) for t in tables)
        if longest > self.max_pages:
            raise ValueError(f"a page table of {longest} pages exceeds the deployment's {self.max_pages}")
        b = self.size_for(n)
        if b not in self.graphs:
            self._capture(b)
        dev = self.model.device
        table = torch.full((n, longest), self.scratch, dtype=torch.int32)
        for i, t in enumerate(tables):
            table[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
        self.input_ids[:n].copy_(torch.tensor(tokens, dtype=torch.int64), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.int32), non_blocking=True)
        self.slots[:n].copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=True)
        self.block_table[:n, :longest].copy_(table.to(dev, non_blocking=True))
        self._pad(n, b)
        self.graphs[b].replay()
        return self.logits[b][:n]
