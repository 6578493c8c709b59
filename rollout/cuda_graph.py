"""CUDA graphs of the decode step: one new token per sequence, the batch padded to a captured size.

A decode step launches a few hundred small kernels; eager launches cost ~10 us each, a graph
replay ~1 us. One graph is captured per padded batch size (on first use), over static input
buffers that every replay refills, all views of one device buffer filled by one copy a step from
its pinned host twin: token ids, positions, cache slots, page tables, and the sampler's seeds and
temperatures (a page-table row is rewritten on the host only when its pages changed). Where every
row of the step is unfiltered (no top-k/top-p) and takes its logprob at one temperature — RL's
usual decode — the graph also samples (the seeded sampler is a pure function of seed, position
and logits) and the step's host work is that copy in and a copy each of the tokens and logprobs
out; otherwise the graph returns logits and the engine samples eagerly. A graph is captured per
(padded size, that temperature).

Why padding cannot change a request's bits in the pinned arms: a graph replays the kernels with
the parameters the selectors returned at capture, for the padded size. With the selection pinned
(detent, det), every kernel reduces a row the same way whatever the rows beside it (a matmul's
schedule may follow the padded size; its K partition does not), so the padded rows — which read
and write one scratch page and are discarded — change nothing, and a graph's logits equal the
eager step's bit for bit (tests/test_engine.py checks it on the GPU).

The stock arm is captured too, as vLLM and SGLang capture theirs: its selection (attention's split
count, cuBLAS's algorithm) is evaluated at capture, for the padded batch size and the deployment's
longest context, and replayed for every batch that pads to that size. It is fast and not
invariant: a request's bits follow the size its batch pads to.
"""
from __future__ import annotations

import math

import torch

from detent_rl.kernels.attention import AttnMeta
from detent_rl.kernels.sampling import sample_unfiltered
from detent_rl.models.context import ForwardContext, KVCache, set_context
from detent_rl.models.model import CausalLM


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch (and max_batch itself)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


def _carve(layout: list[tuple[torch.dtype, tuple[int, ...]]], device: torch.device,
           pin: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One zeroed byte buffer (pinned host memory with `pin`) and a view of it per (dtype, shape) of
    `layout`, each view starting at a multiple of 256 bytes: a kernel sees the alignment a tensor
    of its own would have, so the Triton specializations do not change."""
    offsets, end = [], 0
    for dtype, shape in layout:
        offsets.append(end)
        end += -(-math.prod(shape) * dtype.itemsize // 256) * 256
    buf = torch.zeros(end, dtype=torch.uint8, device=device)
    if pin:
        buf = buf.pin_memory()
    return buf, [buf[at:at + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
                 for at, (dtype, shape) in zip(offsets, layout)]


class DecodeGraphs:
    """Decode-step graphs of `model` over `caches`; rows past the batch use page `scratch_page`."""

    def __init__(self, model: CausalLM, caches: list[KVCache], scratch_page: int, max_batch: int, *,
                 fixed: bool = False, capture: bool = True) -> None:
        """`fixed`: every step padded to `max_batch` (the CoRun arm's one decode shape). `capture=False`
        runs the same padded step eagerly (the CPU, where there are no graphs)."""
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got device {model.device}")
        if not 0 <= scratch_page < caches[0][0].shape[0]:
            raise ValueError(f"scratch page {scratch_page} is outside the cache's {caches[0][0].shape[0]} pages")
        d = model.selections.deployment
        self.model, self.caches, self.scratch = model, caches, scratch_page
        self.max_context = d.max_context
        self.max_pages = -(-d.max_context // model.page_size)
        self.sizes = [max_batch] if fixed else capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.capture = capture
        if model.selections.pinned:
            for b in self.sizes:  # refuse before anything is captured, naming what reads the batch
                self._check_pinned(b)
        dev, B = model.device, self.max_batch
        # the inputs every replay reads, as views of one device buffer that one copy a step fills from
        # its pinned host twin: token ids, positions, slots and seeds as rows of one int64 block
        # (positions are int32 for the kernels: converted in the graph), temperatures, page tables
        layout = [(torch.int64, (4, B)), (torch.float32, (B,)), (torch.int32, (B, self.max_pages))]
        host = torch.device("cpu")
        self._device_bytes, (self.inputs, self.temps, self.block_table) = _carve(layout, dev, False)
        self._host_bytes, (self.staged, self.staged_temps, self.staged_table) = _carve(layout, host, capture)
        self.input_ids, self.positions64, self.slots, self.seeds = self.inputs.unbind(0)
        self.positions = torch.zeros(B, dtype=torch.int32, device=dev)
        for temps, table in ((self.temps, self.block_table), (self.staged_temps, self.staged_table)):
            temps.fill_(1.0)
            table.fill_(scratch_page)
        # numpy views of the host twin: a step writes its rows there without a torch op per row
        self._host_inputs, self._host_temps, self._host_table = (
            t.numpy() for t in (self.staged, self.staged_temps, self.staged_table))
        # the pages each host table row holds (a copy of a sequence's table when it was written): a
        # step rewrites only the rows whose pages changed (a decode fills a page every page_size steps)
        self._scratch_row = [scratch_page]
        self._held: list[list[int]] = [self._scratch_row] * B
        self._uploads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # b -> (device, host) prefix
        pin = (lambda t: t.pin_memory()) if capture else (lambda t: t)  # noqa: E731
        # two pinned pairs for the sampled tokens and logprobs, used in turn: a step can be launched
        # while the host has yet to read its predecessor's (the engine's overlapped decode)
        self._outs = [(pin(torch.zeros(B, dtype=torch.int64)), pin(torch.zeros(B, dtype=torch.float32)))
                      for _ in range(2)]
        self._out_views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (pair, b) -> first b rows
        self._fired = 0
        self.cu_q = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(B, dtype=torch.int32, device=dev)
        self.graphs: dict[tuple[int, float | None], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, float | None], object] = {}
        self.calls: dict[tuple[int, float | None], dict] = {}  # selector calls made by each capture
        self.select_logprobs = model.selections.get("log_softmax")
        self._copied = torch.cuda.Event() if capture else None
        self.pool = torch.cuda.graph_pool_handle() if capture else None

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
        block_m, pack = self.model.attention_tiling(self.model.select_attention(b, 1, b, self.max_context))
        pos = self.positions[:b]
        meta = AttnMeta(cu_q=self.cu_q[:b + 1], pos0=pos, token_pos=pos, block_table=self.block_table[:b],
                        tile_req=self.rows[:b], tile_q0=self.rows[:b], block_m=block_m, pack=pack)
        return ForwardContext(meta=meta, slots=self.slots[:b], kv_caches=self.caches, num_seqs=b, max_seqlen_q=1,
                              max_seqlen_k=self.max_context)

    @torch.inference_mode()
    def _forward(self, b: int, temperature: float | None) -> object:
        self.positions[:b].copy_(self.positions64[:b])
        with set_context(self._context(b)):
            hidden = self.model(self.input_ids[:b], self.positions[:b])
        logits = self.model.logits(hidden)
        if temperature is None:
            return logits
        cfg = self.select_logprobs(b)  # the sampled token is at the next position
        return sample_unfiltered(logits, self.seeds[:b], self.positions64[:b] + 1, self.temps[:b],
                                 temperature=temperature, block=cfg.block, num_warps=cfg.num_warps)

    def drop_captured(self) -> None:
        """Forget every captured graph (the engine freed the caches they read): each size is captured
        again on its next use, over the caches' new storage."""
        self.graphs.clear()
        self.outputs.clear()
        self.calls.clear()

    def _capture(self, key: tuple[int, float | None]) -> None:
        """Capture on scratch inputs: every row token 0 at position 0 in the scratch page."""
        b, temperature = key
        self.inputs[:, :b] = 0
        self.slots[:b] = self.scratch * self.model.page_size
        self.block_table[:b] = self.scratch
        self.temps[:b] = 1.0
        for _ in range(2):  # compile every Triton variant of this size outside the capture
            self._forward(b, temperature)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), self.model.selections.recording() as calls:
            self.outputs[key] = self._forward(b, temperature)
        self.graphs[key] = graph
        self.calls[key] = {site: c for site, c in calls.items() if c}  # what each replay runs

    def _padded_size(self, tokens: list[int], positions: list[int], slots: list[int],
                     tables: list[list[int]]) -> int:
        n = len(tokens)
        if not n == len(positions) == len(slots) == len(tables):
            raise ValueError("tokens, positions, slots and page tables must have one entry per sequence")
        return self.size_for(n)

    def _stage(self, b: int, tokens: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
               seeds: list[int] | None, temps: list[float] | None) -> None:
        """Write the rows of n sequences into the pinned host buffers; rows n..b-1 (the padding) take
        token 0 at position 0 in the scratch page. A page-table row is rewritten only when its pages
        changed (entries past a row's own pages are never read, so they may be stale)."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has left the pinned buffers
        n = len(tokens)
        x = self._host_inputs
        x[0, :n], x[1, :n], x[2, :n] = tokens, positions, slots
        x[3, :n] = seeds if seeds is not None else 0
        x[:, n:b] = 0
        x[2, n:b] = self.scratch * self.model.page_size
        if temps is not None:
            self._host_temps[:n] = temps
            self._host_temps[n:b] = 1.0
        held, table = self._held, self._host_table
        for i, pages in enumerate(tables):
            if pages != held[i]:
                if len(pages) > self.max_pages:
                    raise ValueError(f"a page table of {len(pages)} pages exceeds the deployment's {self.max_pages}")
                table[i, :len(pages)] = pages
                held[i] = list(pages)
        for i in range(n, b):  # a padding row reads its first page only
            if held[i] is not self._scratch_row:
                table[i, 0] = self.scratch
                held[i] = self._scratch_row

    def _upload(self, b: int) -> None:
        """Copy the staged inputs of a b-row step to the device: one copy of the host buffer's prefix
        up to the page table's row b."""
        views = self._uploads.get(b)
        if views is None:
            table_at = self.staged_table.data_ptr() - self._host_bytes.data_ptr()
            end = table_at + b * self.staged_table.stride(0) * self.staged_table.element_size()
            views = self._uploads[b] = (self._device_bytes[:end], self._host_bytes[:end])
        views[0].copy_(views[1], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def _replay(self, key: tuple[int, float | None], n: int, feed: torch.Tensor | None) -> object:
        """Upload the staged inputs and replay the graph of `key` (captured on first use). `feed`: the
        step's token ids are the staged rows' entries of this device tensor (the staged ids are
        indices into it)."""
        if self.capture and key not in self.graphs:
            self._capture(key)  # on the device inputs, which the upload then overwrites
        self._upload(key[0])
        if feed is not None:
            ids = self.input_ids[:n]
            ids.copy_(feed.index_select(0, ids))
        if not self.capture:  # the same padded step, run eagerly
            return self._forward(*key)
        self.graphs[key].replay()
        self.model.selections.replayed(self.calls[key])  # a tuner's profile counts the replayed launches
        return self.outputs[key]

    def run(self, tokens: list[int], positions: list[int], slots: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Logits [n, vocab] of one decode step: token i at `positions[i]` written to `slots[i]`,
        attending over the pages `tables[i]`. The returned tensor is overwritten by the next replay."""
        return self._replay(*self.prepare(tokens, positions, slots, tables, None, None, None), None)[:len(tokens)]

    def prepare(self, tokens: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
                seeds: list[int] | None, temps: list[float] | None,
                temperature: float | None) -> tuple[tuple[int, float | None], int]:
        """Stage a step's rows in the pinned buffers (which the previous step's upload has left), while
        the device may still run that step; its (graph key, rows) for `fire`. With a `temperature` the
        graph also samples: each row's next token at position `positions[i] + 1` with `seeds[i]` and
        `temps[i]`, and its logprob at `temperature` (the rows must suit `sample_unfiltered`; the
        engine checks). Without, it returns logits (`run`)."""
        b = self._padded_size(tokens, positions, slots, tables)
        self._stage(b, tokens, positions, slots, tables, seeds, temps)
        return (b, temperature), len(tokens)

    def fire(self, staged: tuple[tuple[int, float], int], feed: torch.Tensor | None = None) -> "PendingStep":
        """Launch a `prepare`d step: upload, replay, and the copies of its tokens and logprobs out,
        without waiting for them. `feed` (the previous step's `PendingStep.device_tokens`): the staged
        token ids are row indices into it, gathered on the device — the step can be launched before
        the host has read the previous step's tokens. The outputs alternate between two pinned pairs:
        a step must be waited on before the second fire after its own."""
        key, n = staged
        out_tokens, out_logprobs = self._replay(key, n, feed)
        b, pair = out_tokens.shape[0], self._fired % 2
        self._fired += 1
        views = self._out_views.get((pair, b))
        if views is None:
            views = self._out_views[pair, b] = (self._outs[pair][0][:b], self._outs[pair][1][:b])
        views[0].copy_(out_tokens, non_blocking=True)
        views[1].copy_(out_logprobs, non_blocking=True)
        done = None
        if self.capture:
            done = torch.cuda.Event()
            done.record()
        return PendingStep(n, out_tokens, views, done)


class PendingStep:
    """A launched decode step whose sampled tokens the host has not read yet."""

    def __init__(self, n: int, device_tokens: torch.Tensor, host: tuple[torch.Tensor, torch.Tensor],
                 done: torch.cuda.Event | None) -> None:
        self.n, self.device_tokens, self.host, self.done = n, device_tokens, host, done

    def wait(self) -> tuple[list[int], list[float]]:
        """The step's n sampled tokens and their logprobs (the one host sync of a step)."""
        if self.done is not None:
            self.done.synchronize()
        return self.host[0][:self.n].tolist(), self.host[1][:self.n].tolist()
