"""Whole-step CUDA graphs of the engine's prefill and mixed steps: `rollout/step_graphs.py`'s pieces with attention
inside, one graph a padded size.

The pieces leave attention eager between them because its launch grid follows the step: a tile per `rows a tile`
query rows of each request, over the step's own metadata (24 eager calls a 0.5B step, ~1.1 ms of host against
~1.8 ms of device time in a mixed step: docs/BENCHMARKS.md, session 48). A graph fixes the grid at capture, so a
whole-step graph of b padded rows launches the most tiles such a step can have, ceil(b / rows a tile) + its most
requests, over request slots for the engine's most sequences plus one idle request. The tiles past the step's own
point at the idle request (no rows, position 0): each of their programs reads that request's span, finds no key and
returns, as the splits past a tile's last key do in every call (the split count is the deployment's already). The
padding rows (past the step's tokens) belong to no request: the combine alone reads them, and the row-wise kernels
after it carry whatever it writes there to no real row. A step's inputs and metadata are staged on the host, in
numpy views of one pinned buffer, and uploaded in one copy: no `step_inputs`, no `attn_meta`.

Bits: a row's attention reduces in an order fixed by its position, the KV tile and the split size. In the pinned
arms the graph's selection shares both with the step's own (checked per step: a step whose selection differs runs
through the pieces), and the query tile and the grid are schedules, so a step through the whole graph gives the
eager step's bits (tests/test_full_steps.py). The stock arm takes the capture's selection (its split heuristic at
the size's most requests and the deployment's context), as a stock engine's full graphs do: its bits follow the
padding.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from detent_rl.kernels.attention import AttnMeta
from detent_rl.models.context import ForwardContext, KVCache, set_context
from detent_rl.models.model import CausalLM
from detent_rl.models.runner import Span, check_spans
from detent_rl.rollout.cuda_graph import _carve
from detent_rl.rollout.step_graphs import StepGraphs


class FullStepGraphs(StepGraphs):
    """`StepGraphs` whose steps of up to `max_seqs` sequences replay one graph of the whole forward (attention in);
    the pieces stay for the steps it does not take (`takes`). `capture=False` runs the same padded step eagerly."""

    def __init__(self, model: CausalLM, caches: list[KVCache], scratch_page: int, max_tokens: int, max_seqs: int, *,
                 capture: bool = True) -> None:
        super().__init__(model, caches, scratch_page, max_tokens, capture=capture)
        d = model.selections.deployment
        top, self.requests = self.max_tokens, max_seqs + 1  # request slots: the step's and the idle one
        self.max_context, self.max_pages = d.max_context, -(-d.max_context // model.page_size)
        tiles = top + self.requests  # more than any size's grid: a tile holds a row at least
        layout = [(torch.int64, (2, top)), (torch.int32, (top,)), (torch.int32, (self.requests + 1,)),
                  (torch.int32, (self.requests,)), (torch.int32, (tiles,)), (torch.int32, (tiles,)),
                  (torch.int32, (self.requests, self.max_pages))]
        # the pieces' inputs become views of the uploaded buffer: token ids and slots, positions (the rows'
        # token_pos), then the metadata: query spans, first positions, tiles' requests and first rows, page table
        self._device_bytes, views = _carve(layout, model.device, False)
        self._host_bytes, host = _carve(layout, torch.device("cpu"), capture)
        ids_slots, self.positions, self.cu_q, self.pos0, self.tile_req, self.tile_q0, self.table = views
        self.input_ids, self.slots = ids_slots.unbind(0)
        self._host = [t.numpy() for t in host]
        self._host[0][1] = self.scratch_slot
        self.slots.fill_(self.scratch_slot)
        self._copied = torch.cuda.Event() if capture else None
        self.whole: dict[int, torch.cuda.CUDAGraph] = {}
        self.whole_outputs: dict[int, torch.Tensor] = {}
        self.whole_calls: dict[int, dict] = {}
        self.whole_runs: dict[int, int] = {}  # steps run through the whole graphs, per size
        self._selections: dict[int, Any] = {}

    def _shape(self, b: int) -> tuple[int, int]:
        """(sequences, most query rows of one) a size's graph selects attention for: its most of both."""
        return min(self.requests - 1, b), b

    def selection(self, b: int) -> Any:
        """The attention selection of size b's graph (at the deployment's longest context)."""
        s = self._selections.get(b)
        if s is None:
            s = self._selections[b] = self.model.select_attention(*self._shape(b), b, self.max_context)
        return s

    def tiles(self, b: int) -> tuple[int, int]:
        """(rows a tile, tiles of the grid) of size b's graph: the most tiles a step of b rows has."""
        block_m, pack = self.model.attention_tiling(self.selection(b))
        per = block_m // pack
        return per, -(-b // per) + min(self.requests - 1, b)

    def takes(self, spans: list[Span]) -> bool:
        """Whether a step runs through a whole graph: it fits the rows, request slots and the context's pages, and
        (pinned arms) its attention selection has the graph's KV tile and split size."""
        n = sum(len(s.tokens) for s in spans)
        if not spans or n > self.max_tokens or len(spans) >= self.requests:
            return False
        longest = max(s.cached + len(s.tokens) for s in spans)
        if longest > self.max_pages * self.model.page_size:
            return False  # (a table may be wider than its keys: only the pages they fill are staged)
        if not self.model.selections.pinned:
            return True  # the capture's selection, as a stock engine's full graphs
        own = self.model.select_attention(len(spans), max(len(s.tokens) for s in spans), n, longest)
        graph = self.selection(self.size_for(n))
        return (own.block_n, own.split_size) == (graph.block_n, graph.split_size)

    def _stage(self, spans: list[Span]) -> tuple[int, int]:
        """Write a step's rows and metadata into the pinned host buffer, padded to its size; (rows, size)."""
        check_spans(self.model, spans)
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()  # the previous step's copy has left the host buffer
        ids_slots, pos, cu, pos0, tile_req, tile_q0, table = self._host
        page, B = self.model.page_size, len(spans)
        q_lens = np.fromiter((len(s.tokens) for s in spans), np.int64, B)
        cached = np.fromiter((s.cached for s in spans), np.int64, B)
        ends = np.cumsum(q_lens)
        n, b = int(ends[-1]), self.size_for(int(ends[-1]))
        starts = ends - q_lens
        ids_slots[0, :n] = [t for s in spans for t in s.tokens]
        for i, s in enumerate(spans):
            need = -(-(s.cached + len(s.tokens)) // page)
            table[i, :need] = s.pages[:need]
        row = np.repeat(np.arange(B), q_lens)
        p = np.arange(n) - np.repeat(starts - cached, q_lens)
        pos[:n] = p
        ids_slots[1, :n] = table[row, p // page].astype(np.int64) * page + p % page
        ids_slots[0, n:b], ids_slots[1, n:b], pos[n:b] = 0, self.scratch_slot, 0  # padding: the scratch page
        cu[0], cu[1:B + 1], cu[B + 1:] = 0, ends, n
        pos0[:B], pos0[B:] = cached, 0
        per, grid = self.tiles(b)
        counts = -(-q_lens // per)
        t = int(counts.sum())
        tile_req[:t] = np.repeat(np.arange(B), counts)
        tile_q0[:t] = np.repeat(starts, counts) + per * (np.arange(t) - np.repeat(np.cumsum(counts) - counts, counts))
        tile_req[t:grid], tile_q0[t:grid] = B, n  # the idle request's: no rows
        return n, b

    def _context_whole(self, b: int) -> ForwardContext:
        block_m, pack = self.model.attention_tiling(self.selection(b))
        grid = self.tiles(b)[1]
        meta = AttnMeta(cu_q=self.cu_q, pos0=self.pos0, token_pos=self.positions[:b], block_table=self.table,
                        tile_req=self.tile_req[:grid], tile_q0=self.tile_q0[:grid], block_m=block_m, pack=pack)
        seqs, rows = self._shape(b)
        return ForwardContext(meta=meta, slots=self.slots[:b], kv_caches=self.caches, num_seqs=seqs,
                              max_seqlen_q=rows, max_seqlen_k=self.max_context)

    def _forward_whole(self, b: int) -> torch.Tensor:
        with set_context(self._context_whole(b)):
            return self.model(self.input_ids[:b], self.positions[:b])

    @torch.inference_mode()
    def capture_whole(self, b: int) -> None:
        """Capture size b's whole graph on padding inputs (every row's key to the scratch page, no request)."""
        if b not in self.sizes:
            raise ValueError(f"{b} is not a piece size ({self.sizes})")
        self._stage_idle(b)
        for _ in range(2):  # compile every Triton variant of this size outside the capture
            self._forward_whole(b)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), self.model.selections.recording() as made:
            self.whole_outputs[b] = self._forward_whole(b)
        self.whole[b] = graph
        self.whole_calls[b] = {site: c for site, c in made.items() if c}

    def _stage_idle(self, b: int) -> None:
        """Every row padding, every tile the idle request's (request 0, no rows)."""
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()
        ids_slots, pos, cu, pos0, tile_req, tile_q0, _ = self._host
        ids_slots[0, :b], ids_slots[1, :b], pos[:b], cu[:], pos0[:] = 0, self.scratch_slot, 0, 0, 0
        grid = self.tiles(b)[1]
        tile_req[:grid], tile_q0[:grid] = 0, 0
        self._upload()

    def _upload(self) -> None:
        self._device_bytes.copy_(self._host_bytes, non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def run(self, spans: list[Span]) -> torch.Tensor:
        """Final hidden states [n, hidden] of a step the graphs `take`, through its size's whole graph (captured
        on first use). The returned tensor is overwritten by the next step through the graphs."""
        b = self.size_for(sum(len(s.tokens) for s in spans))
        if self.capture and b not in self.whole:
            self.capture_whole(b)  # on padding inputs, before the step's are staged
        n, b = self._stage(spans)
        self.whole_runs[b] = self.whole_runs.get(b, 0) + 1
        self._upload()
        if not self.capture:
            with torch.inference_mode():
                return self._forward_whole(b)[:n]
        self.whole[b].replay()
        self.model.selections.replayed(self.whole_calls[b])  # a tuner's profile counts the replayed launches
        return self.whole_outputs[b][:n]

    def warm(self) -> int:
        """Capture every size's whole graph not captured yet (the pieces stay for the steps the graphs do not
        take, captured on use); how many were."""
        todo = [b for b in self.sizes if b not in self.whole] if self.capture else []
        for b in todo:
            self.capture_whole(b)
        return len(todo)

    def drop_captured(self) -> None:
        super().drop_captured()
        self.whole.clear()
        self.whole_outputs.clear()
        self.whole_calls.clear()
