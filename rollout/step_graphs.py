"""Piecewise CUDA graphs of the engine's other steps: prefill, chunked prefill, and decode rows beside a chunk.

A decode step has one shape per batch size and is one graph (`rollout/cuda_graph.py`). A prefill or mixed step
varies in every dimension attention reads (sequences, query spans, cached lengths), so its whole forward cannot
be one graph; launched eagerly it is host-bound, in every arm: ~245 launches a forward at 10-30 µs of host each,
against 2-17 ms of GPU (docs/BENCHMARKS.md, sessions 31 and 33). What stock engines do (vLLM V1's piecewise
graphs): everything between two attention calls is row-wise — a row's outputs read only that row — so that part
is captured at a padded token count (`step_sizes`), and attention runs eagerly between the pieces on the step's
real rows with the step's own metadata. Piece 0 is the embedding and layer 0's head; piece i is layer i - 1's
tail and layer i's head (`DecoderLayer.head`/`tail`: the norms, the projections, rotary with the key store,
SiLU-and-mul, the MLP); the last piece is the last tail and the final norm.

Bits: the pieces run the model's own kernels, in its order, on the padded rows; the padding rows (token 0 at
position 0, keys stored into the scratch page) change no real row, since every piece is row-wise. In the pinned
arms a row's bits do not depend on the row count either, so a step through the pieces gives the eager step's
bits (tests/test_step_graphs.py); the stock arm's selections and cuBLAS read the padded count at capture, as a
stock engine's graphs do, and its bits move with the padding (the CoRun arm's prefill, one request alone, pads by
that request's length only: its rollout stays batch-invariant). Attention's output is written into one buffer the
next piece reads; each piece's q stays where its capture put it, in the graph pool, referenced without holding it
(`_unowned`): piece i + 1's capture may reuse that memory only for what runs after attention i has read q.

On the CPU (`capture=False`) the same padded pieces run eagerly: the tests' way to check the padding's bits.
"""
from __future__ import annotations

from typing import Callable

import torch

from detent_rl.models.context import ForwardContext, KVCache, get_context, set_context
from detent_rl.models.model import CausalLM

SIZE_STRIDES = ((128, 16), (1024, 64), (None, 256))  # (up to, stride) of the piece sizes


def step_sizes(max_tokens: int) -> list[int]:
    """The padded token counts of the pieces, up to `max_tokens` rounded up to a multiple of 16: every multiple of
    16 to 128, of 64 to 1,024, of 256 beyond. A step pads at most 15 rows to 128 tokens, 63 to 1,024, 255 beyond
    (a quarter of the rows at worst, at 1,025; ~12 % on average there): the GPU time of padding rows, against
    the host time of an eager forward (10-30 ms) the graphs save."""
    top = -(-max_tokens // 16) * 16
    sizes, at = [], 0
    for bound, stride in SIZE_STRIDES:
        end = top if bound is None else min(bound, top)
        sizes += range(at + stride, end + 1, stride)
        at = max(at, end)
    return sorted(set(sizes + [top]))


def _unowned(t: torch.Tensor) -> torch.Tensor:
    """A view of `t`'s memory that does not keep it allocated (torch.compile's CUDA-graph trees read their
    graphs' outputs the same way): the graph pool keeps the memory while its graphs exist."""
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(alias, t.storage_offset(), t.shape, t.stride())


Piece = Callable[[torch.Tensor | None], tuple[torch.Tensor, torch.Tensor] | torch.Tensor]


class StepGraphs:
    """The pieces of `model`'s forward at every size of `step_sizes(max_tokens)`, over `caches`; the padding
    rows' keys go to page `scratch_page`. `capture=False` runs them eagerly (the CPU)."""

    def __init__(self, model: CausalLM, caches: list[KVCache], scratch_page: int, max_tokens: int, *,
                 capture: bool = True) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got device {model.device}")
        if not 0 <= scratch_page < caches[0][0].shape[0]:
            raise ValueError(f"scratch page {scratch_page} is outside the cache's {caches[0][0].shape[0]} pages")
        self.model, self.caches, self.capture = model, caches, capture
        self.layers = list(model.model.layers)
        self.sizes = step_sizes(max_tokens)
        self.max_tokens = top = self.sizes[-1]
        dev, attn = model.device, self.layers[0].self_attn
        self.scratch_slot = scratch_page * model.page_size
        # the pieces' inputs: token ids, positions, cache slots; rows past a step's own are padding
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(top, dtype=torch.int32, device=dev)
        self.slots = torch.full((top,), self.scratch_slot, dtype=torch.int64, device=dev)
        # attention's output rows, which the next piece reads (padding rows: whatever a step left there)
        self.attended = torch.zeros((top, attn.num_heads, attn.head_dim), dtype=model.dtype, device=dev)
        self.q_size = attn.q_size
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.queries: dict[int, list[torch.Tensor]] = {}  # per size: each layer's q, as captured (unowned)
        self.outputs: dict[int, torch.Tensor] = {}  # per size: the final hidden states
        self.calls: dict[int, list[dict]] = {}  # per size: the selector calls each piece's capture made
        self.runs: dict[int, int] = {}  # steps run through the pieces, per size
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def fits(self, tokens: int) -> bool:
        return tokens <= self.max_tokens

    def size_for(self, tokens: int) -> int:
        for b in self.sizes:
            if b >= tokens:
                return b
        raise ValueError(f"a step of {tokens} tokens exceeds the largest piece size {self.max_tokens}")

    def _context(self, b: int) -> ForwardContext:
        """What the pieces read of a context: the caches and the padded slots (attention is not in them)."""
        return ForwardContext(meta=None, slots=self.slots[:b], kv_caches=self.caches, num_seqs=b, max_seqlen_q=1,
                              max_seqlen_k=1)

    def _pieces(self, b: int) -> list[Piece]:
        """The forward's pieces at b rows: each takes the previous piece's residual, returns (q, residual) (the
        last: the final hidden states)."""
        ids, pos, attended = self.input_ids[:b], self.positions[:b], self.attended[:b].view(b, self.q_size)
        layers, norm = self.layers, self.model.model.norm

        def first(_: None) -> tuple[torch.Tensor, torch.Tensor]:
            (q, _k, _v), residual = layers[0].head(pos, self.model.model.embed_tokens(ids), None)
            return q, residual

        def middle(i: int) -> Piece:
            def piece(residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                (q, _k, _v), residual = layers[i].head(pos, *layers[i - 1].tail(attended, residual))
                return q, residual
            return piece

        def last(residual: torch.Tensor) -> torch.Tensor:
            return norm(*layers[-1].tail(attended, residual))[0]

        return [first] + [middle(i) for i in range(1, len(layers))] + [last]

    def warm(self) -> int:
        """Capture every piece size not captured yet; how many were."""
        todo = [b for b in self.sizes if b not in self.graphs] if self.capture else []
        for b in todo:
            self.capture_size(b)
        return len(todo)

    def drop_captured(self) -> None:
        """Forget every captured piece (the engine freed the caches they write): captured again on next use."""
        self.graphs.clear()
        self.queries.clear()
        self.outputs.clear()
        self.calls.clear()

    @torch.inference_mode()
    def capture_size(self, b: int) -> None:
        """Capture the pieces at b rows, on padding inputs (every row's keys to the scratch page)."""
        if b not in self.sizes:
            raise ValueError(f"{b} is not a piece size ({self.sizes})")
        self.slots[:b].fill_(self.scratch_slot)  # the warm-up runs write keys: to the scratch page only
        pieces = self._pieces(b)
        with set_context(self._context(b)):
            for _ in range(2):  # compile every Triton variant of this size outside the capture
                carry = None
                for piece in pieces[:-1]:
                    _, carry = piece(carry)
                pieces[-1](carry)
            torch.cuda.synchronize()
            graphs, queries, calls = [], [], []
            carry = None  # the previous piece's residual: held until the next piece has been captured
            for i, piece in enumerate(pieces):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool), self.model.selections.recording() as made:
                    out = piece(carry)
                graphs.append(graph)
                calls.append({site: c for site, c in made.items() if c})
                if i < len(self.layers):
                    q, carry = out
                    queries.append(_unowned(q))  # read by attention i, before piece i + 1 runs
                else:
                    self.outputs[b] = out
        self.graphs[b], self.queries[b], self.calls[b] = graphs, queries, calls

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model's forward of a step's n tokens (`CausalLM.forward`, inside the step's `set_context`), through
        the pieces at the step's padded size; final hidden states [n, hidden]. The returned tensor is
        overwritten by the next step through the pieces (the sizes share one graph pool, and a size's output may
        sit in memory another size's pieces use while they run)."""
        ctx = get_context()
        n = input_ids.shape[0]
        b = self.size_for(n)
        self.runs[b] = self.runs.get(b, 0) + 1
        if self.capture and b not in self.graphs:
            self.capture_size(b)  # on padding inputs, which the step's then overwrite
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(ctx.slots)
        if n < b:
            self.slots[n:b].fill_(self.scratch_slot)  # the padding rows' keys: never a real page
        attended = self.attended[:n]
        if not self.capture:
            return self._eager(b, n, attended)
        graphs, queries = self.graphs[b], self.queries[b]
        for graph, q, layer in zip(graphs, queries, self.layers):
            graph.replay()
            layer.self_attn.attend(q[:n], None, None, out=attended)
        graphs[-1].replay()
        selections = self.model.selections
        for made in self.calls[b]:  # a tuner's profile counts the replayed launches
            selections.replayed(made)
        return self.outputs[b][:n]

    def _eager(self, b: int, n: int, attended: torch.Tensor) -> torch.Tensor:
        """The padded pieces run eagerly, attention between them as in `forward`."""
        pieces, piece_ctx, carry = self._pieces(b), self._context(b), None
        for piece, layer in zip(pieces, self.layers):
            with set_context(piece_ctx):
                q, carry = piece(carry)
            layer.self_attn.attend(q[:n], None, None, out=attended)
        with set_context(piece_ctx):
            return pieces[-1](carry)[:n]
