"""The embedded rollout engine: continuous batching over the paged cache, seeded sampling, rescore.

`generate` runs requests to completion; each sampled token's logprob is the fp32
log_softmax(logits / T) at that token (T = 1 for greedy), computed by the same kernels and
selections as `rescore`, which recomputes a finished sequence the trainer's way — one prefill of
prompt + completion — and returns the completion's logprobs. With the pinned (detent) selections
the two are equal bit for bit; with the stock arm they are not.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch

from detent_rl.kernels.attention import device_tensor
from detent_rl.kernels.sampling import sample, sample_unfiltered, unfiltered
from detent_rl.models.context import set_context
from detent_rl.models.loader import update_weights
from detent_rl.models.model import CausalLM
from detent_rl.models.runner import Span as StepSpan
from detent_rl.models.runner import completion_logprobs, step_inputs
from detent_rl.rollout import vmm
from detent_rl.rollout.block_manager import BlockManager
from detent_rl.rollout.cuda_graph import DecodeGraphs, PendingStep
from detent_rl.rollout.full_steps import FullStepGraphs
from detent_rl.rollout.scheduler import Scheduler, Span
from detent_rl.rollout.sequence import SamplingParams, Sequence
from detent_rl.rollout.step_graphs import StepGraphs


class Engine:
    """`cuda_graphs`: replay decode steps from CUDA graphs captured per padded batch size (default:
    on for a CUDA model, in every arm; the stock arm's graphs fix its selection at capture, as stock
    engines do, and stay batch-dependent: `rollout/cuda_graph.py`). `step_graphs`: run every other step (prefill,
    chunks, decode rows beside a chunk) through piecewise graphs at a padded token count, attention eager between
    the pieces (`rollout/step_graphs.py`; on the CPU the same padded pieces eagerly); off by default. `full_steps`:
    those steps through one graph of the whole forward a padded size instead, attention inside over a grid of the
    size's most tiles (`rollout/full_steps.py`; the pieces stay for a step it does not take). `releasable`:
    the KV cache in memory whose physical pages `release_memory` gives back at kept addresses (`rollout/vmm.py`, on
    CUDA), so that the captured graphs survive a release; off by default (elsewhere a release drops the graphs).

    The CoRun arm (`corun`: stock's selections and cuBLAS linears) runs CoRun's fixed shapes instead of
    pins: each prefill alone and whole (no chunks, no prefix cache; `chunk_size` and `max_num_tokens`
    do not apply, a prompt must fit the deployment's step), every decode step padded to the
    deployment's `max_batch` rows, its maximum concurrency (one graph on the GPU, the same padded step
    eagerly on the CPU), seeded sampling. Its rollout
    is then batch-invariant, but its decode and the trainer's one-shot prefill still select
    differently (another attention tile and split, other GEMM shapes), so rescoring does not give the
    rollout's bits: the trainer would need the rollout's own shapes."""

    def __init__(self, model: CausalLM, *, num_blocks: int, max_num_seqs: int | None = None,
                 max_num_tokens: int | None = None, chunk_size: int = 256, cuda_graphs: bool | None = None,
                 overlap: bool = True, step_graphs: bool = False, full_steps: bool = False,
                 releasable: bool = False) -> None:
        limit = model.selections.deployment.max_num_tokens
        max_num_tokens = max_num_tokens or limit
        if max_num_tokens > limit:
            raise ValueError(f"max_num_tokens {max_num_tokens} exceeds the deployment's {limit}")
        max_batch = model.selections.deployment.max_batch
        max_num_seqs = max_num_seqs or min(64, max_batch)
        if max_num_seqs > max_batch:
            raise ValueError(f"max_num_seqs {max_num_seqs} exceeds the deployment's max_batch {max_batch}")
        if cuda_graphs is None:
            cuda_graphs = model.device.type == "cuda"
        self.model = model
        self.corun = model.selections.arm == "corun"
        self.blocks = BlockManager(num_blocks, model.page_size, prefix_cache=not self.corun)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, limit if self.corun else max_num_tokens, chunk_size,
                                   isolated_prefill=self.corun)
        # one page more than the block manager hands out: the scratch page of padded graph rows
        self.memory = None  # the cache's memory, where `release_memory` frees it at kept addresses
        if releasable and model.device.type == "cuda" and vmm.available():
            self.memory = vmm.ReleasableMemory(model.kv_cache_bytes(num_blocks + 1), model.device)
        self.caches = model.allocate_kv_cache(num_blocks + 1,
                                              memory=None if self.memory is None else self.memory.tensor)
        self.graphs = None
        if cuda_graphs or self.corun:
            # CoRun's one decode shape is the deployment's maximum concurrency, whatever this engine's slots
            rows = max_batch if self.corun else max_num_seqs
            self.graphs = DecodeGraphs(model, self.caches, num_blocks, rows, fixed=self.corun,
                                       capture=bool(cuda_graphs))
        self.steps = None
        if full_steps:
            self.steps = FullStepGraphs(model, self.caches, num_blocks, self.scheduler.max_num_tokens, max_num_seqs,
                                        capture=model.device.type == "cuda")
        elif step_graphs:
            self.steps = StepGraphs(model, self.caches, num_blocks, self.scheduler.max_num_tokens,
                                    capture=model.device.type == "cuda")
        self.full_steps = full_steps
        self._select_logprobs = model.selections.get("log_softmax")
        self.overlap = overlap
        self._inflight: tuple[list[Span], PendingStep] | None = None  # a launched step, tokens unread
        self.released = False  # the KV cache's memory is freed (`release_memory`) until the next step
        self.eager_steps = 0  # steps through `_step` (prefill, mixed, filtered decode rows), not a sampling graph
        self.eager_tokens = 0  # the tokens those steps ran

    @classmethod
    def for_requests(cls, model: CausalLM, sequences: int, tokens: int, max_num_seqs: int, **options) -> "Engine":
        """An engine with pages for `sequences` requests of up to `tokens` tokens each (and 8 spare),
        `max_num_seqs` of them in flight (`options`: the constructor's others)."""
        return cls(model, num_blocks=sequences * -(-tokens // model.page_size) + 8, max_num_seqs=max_num_seqs,
                   **options)

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Sequence]:
        """Run the requests to completion; their sequences, in order."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self._check_request(p, sp, f"request {i}")
        seqs = [self.add(p, sp) for p, sp in zip(prompts, params)]
        while not self.idle:
            self.step()
        return seqs

    def warmup(self, temperatures: tuple[float | None, ...] = (1.0,)) -> dict:
        """Compile before the first request what serving would compile inside one: a synthetic step of every
        class of steps the kernels tell apart, and every decode graph size at each of `temperatures`
        (`rollout/warmup.py`). Needs an idle engine; flushes the prefix cache. {"steps", "graphs", "compiled",
        "seconds"}."""
        from detent_rl.rollout.warmup import warmup

        return warmup(self, temperatures)

    def _check_request(self, prompt: list[int], params: SamplingParams, what: str) -> None:
        limit = self.model.max_positions
        if len(prompt) + params.max_tokens > limit:
            raise ValueError(f"{what}: {len(prompt)} prompt tokens + max_tokens {params.max_tokens} exceed the "
                             f"deployment's context of {limit} positions")

    def add(self, prompt: list[int], params: SamplingParams) -> Sequence:
        """Queue one request (online serving: `step` until it finishes); its sequence."""
        self._check_request(prompt, params, "request")
        seq = Sequence(list(prompt), params, self.model.page_size)
        self.scheduler.add(seq)
        return seq

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and self._inflight is None

    def step(self) -> list[Sequence]:
        """One engine step over the queued requests; the sequences that finished in it.

        Overlapped decode (`overlap`, where the decode graph samples): while a decode step runs on the
        device, the host schedules and stages the next one (`Scheduler.schedule_ahead`) and launches
        it behind the running one — its token ids gathered on the device from the running step's
        output — then waits for the running step's tokens and records them while the device runs
        the next. The device then never waits for the host between decode steps. A sequence that
        samples a stop token has a row in the step launched ahead, which is discarded (its own pages,
        freed after): with pinned kernels that row changes no other row's bits; in the stock arm it
        changes the batch, as an overlapping stock engine's would."""
        if self.released:
            self._resume_memory()
        with torch.inference_mode():  # (not a decorator: its wrapper costs as much again, every step)
            if self._inflight is None:
                spans = self.scheduler.schedule()
                if not spans:
                    raise RuntimeError("the scheduler made no progress (cache too small for the waiting request?)")
                staged = self._stage_sampled(spans, None)
                if staged is None:
                    return self.scheduler.postprocess(spans, self._step(spans))
                pending = self.graphs.fire(staged)
            else:
                spans, pending = self._inflight
                self._inflight = None
            ahead = self.scheduler.schedule_ahead(spans) if self.overlap else None
            staged = self._stage_sampled(ahead, spans) if ahead else None
            if staged is not None:  # queued behind the running step: the device never waits for the host
                self._inflight = (ahead, self.graphs.fire(staged, pending.device_tokens))
            tokens, logprobs = pending.wait()
            return self.scheduler.postprocess(spans, dict(zip([s.seq.seq_id for s in spans], zip(tokens, logprobs))))

    def _stage_sampled(self, spans: list[Span], previous: list[Span] | None) -> tuple | None:
        """Stage a decode step whose graph samples (one copy in, one copy out), for `DecodeGraphs.fire`;
        None where the step is not one. `previous`: the step whose tokens, still on the device, this
        one takes as input (by row)."""
        if not self._graphed(spans):
            return None
        params = [s.seq.params for s in spans]
        temperature = self._graph_temperature(params)
        if temperature is None:
            return None
        tokens, pos, slots, tables = self._decode_inputs(spans) if previous is None else self._ahead_inputs(
            spans, previous)
        return self.graphs.prepare(tokens, pos, slots, tables, [p.seed for p in params],
                                   [p.temperature for p in params], temperature)

    def _ahead_inputs(self, spans: list[Span], previous: list[Span]):
        """`_decode_inputs` of a step scheduled ahead: in place of each token id, its sequence's row in
        `previous`, whose sampled token it is."""
        row = {s.seq.seq_id: i for i, s in enumerate(previous)}
        _, pos, slots, tables = self._decode_inputs(spans)
        return [row[s.seq.seq_id] for s in spans], pos, slots, tables

    def _graphed(self, spans: list[Span]) -> bool:
        """Whether the step is a decode step the captured graphs serve: one new token per sequence, each
        sampled, at most the largest captured batch."""
        return self.graphs is not None and len(spans) <= self.graphs.max_batch and all(
            s.count == 1 and s.samples for s in spans)

    def _decode_inputs(self, spans: list[Span]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
        seqs = [s.seq for s in spans]
        pos = [s.start for s in spans]
        tables = [q.block_table for q in seqs]
        return [q.tokens[p] for q, p in zip(seqs, pos)], pos, self.blocks.slots(seqs, pos), tables

    def _logits(self, spans: list[Span], graphed: bool) -> torch.Tensor | None:
        """The step's forward; logits of each sampling span's last token (None if none samples)."""
        if graphed:
            return self.graphs.run(*self._decode_inputs(spans))
        step = [StepSpan(s.seq.tokens[s.start:s.start + s.count], s.start, s.seq.block_table) for s in spans]
        if self.full_steps and self.steps.takes(step):
            hidden = self.steps.run(step)
        else:
            input_ids, positions, ctx = step_inputs(self.model, self.caches, step)
            with set_context(ctx):
                if self.steps is not None and self.steps.fits(input_ids.shape[0]):
                    hidden = self.steps.forward(input_ids, positions)
                else:
                    hidden = self.model(input_ids, positions)
        ends, at = [], 0
        for s in spans:
            at += s.count
            if s.samples:
                ends.append(at - 1)
        if not ends:
            return None
        # the rows by a device index copied without waiting (`hidden[ends]` copies a host list and waits for the
        # device's queue: the whole step, before the LM head and the sampler could be launched behind it)
        return self.model.logits(hidden.index_select(0, device_tensor(ends, torch.int64, hidden.device)))

    @staticmethod
    def _graph_temperature(params: list[SamplingParams]) -> float | None:
        """The one temperature every row takes its logprob at (greedy rows: 1.0), if the rows need no
        top-k/top-p: then the decode graph samples too. None otherwise."""
        rows = {(p.temperature, p.top_k, p.top_p) for p in params}  # a step's rows share a few settings
        temps = {t if t > 0 else 1.0 for t, _, _ in rows}
        if len(temps) != 1 or not all(unfiltered(*r) for r in rows):
            return None
        t = temps.pop()
        return t if math.isfinite(t) else None

    def _step(self, spans: list[Span]) -> dict[int, tuple[int, float]]:
        """A step whose graph does not sample (prefill, filtered rows, eager engines): logits, then the
        eager sampler."""
        self.eager_steps += 1
        self.eager_tokens += sum(s.count for s in spans)
        launched = self._launch(spans)
        if launched is None:
            return {}
        sampling, tokens, logprobs = launched
        return {s.seq.seq_id: (t, lp) for s, t, lp in zip(sampling, tokens.tolist(), logprobs.tolist())}

    def _launch(self, spans: list[Span]) -> tuple[list[Span], torch.Tensor, torch.Tensor] | None:
        """Launch an eager step's forward, LM head and sampler without waiting for the device (rows of one
        temperature without top-k/top-p; `sample`'s checks read the device); (its sampling spans, their tokens
        and logprobs on the device), or None if no span samples."""
        graphed = self._graphed(spans)
        logits = self._logits(spans, graphed)
        if logits is None:
            return None
        sampling = [s for s in spans if s.samples]
        dev = logits.device
        p = [s.seq.params for s in sampling]
        # a decode step's logprob selection is the one its graph ran at: the padded size
        cfg = self._select_logprobs(self.graphs.size_for(len(sampling)) if graphed else len(sampling))
        # two host tensors and two copies (torch.tensor(..., device=cuda) would copy and sync five times)
        ints = device_tensor([[x.seed for x in p], [len(s.seq) for s in sampling], [x.top_k for x in p]],
                             torch.int64, dev)
        floats = device_tensor([[x.temperature for x in p], [x.top_p for x in p]], torch.float32, dev)
        one = self._graph_temperature(p)
        if one is not None:  # RL's usual rows: `sample`'s bits without its checks' and its temperatures' host syncs
            tokens, logprobs = sample_unfiltered(logits, ints[0], ints[1], floats[0], temperature=one,
                                                 block=cfg.block, num_warps=cfg.num_warps)
        else:
            tokens, logprobs = sample(logits, ints[0], ints[1], temperature=floats[0], top_k=ints[2],
                                      top_p=floats[1], block=cfg.block, num_warps=cfg.num_warps)
        return sampling, tokens, logprobs

    @torch.inference_mode()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *,
                       strict: bool = True) -> int:
        """Copy new weights into the model in place (HF names, or the model's own fused names) and
        flush the prefix cache, whose keys the old weights computed. Only between `generate` calls."""
        if not self.scheduler.idle:
            raise RuntimeError("update_weights while requests are in flight; call it between generate calls")
        n = update_weights(self.model, weights, strict=strict)
        self.flush_cache()
        return n

    def release_memory(self) -> int:
        """Free the KV cache's memory while the engine is idle (a colocated trainer's update can use it):
        the prefix cache is flushed (its pages are gone). The next `step` takes the memory back, zeroed.
        Returns the bytes freed. A `releasable` engine on CUDA gives back the physical memory under the
        cache's reserved addresses (`rollout/vmm.py`), so its captured graphs stay valid; otherwise the
        cache's storage is freed and the captured graphs (decode and pieces), which hold its addresses,
        are dropped, to be captured again as their sizes recur. Bit-neutral: every page a request reads
        is written by that request first, and the graphs, kept or captured again, run the same kernels."""
        if not self.idle:
            raise RuntimeError("release_memory while requests are in flight; call it between generate calls")
        if self.released:
            return 0
        self.flush_cache()
        if self.memory is not None:
            freed = self.memory.release()
        else:
            freed = 0
            for k, v in self.caches:
                for t in (k, v):
                    freed += t.untyped_storage().nbytes()
                    t.untyped_storage().resize_(0)
            for graphs in (self.graphs, self.steps):
                if graphs is not None:
                    graphs.drop_captured()
        self.released = True
        return freed

    def _resume_memory(self) -> None:
        if self.memory is not None:
            self.memory.restore()
            self.memory.tensor.zero_()
        else:
            for k, v in self.caches:
                for t in (k, v):
                    t.untyped_storage().resize_(t.numel() * t.element_size())
                    t.zero_()
        self.released = False

    def flush_cache(self) -> None:
        """Forget every cached prefix block (their keys were computed by the current weights)."""
        if not self.scheduler.idle:
            raise RuntimeError("flush_cache while requests are in flight; call it between generate calls")
        self.blocks.flush()

    @torch.inference_mode()
    def rescore(self, seq: Sequence) -> list[float]:
        """The trainer's computation (`completion_logprobs`: one prefill of prompt + completion in
        scratch pages) of a finished sequence's completion logprobs."""
        return completion_logprobs(self.model, [(seq.tokens, seq.num_prompt)], [seq.params.temperature])[0].tolist()
