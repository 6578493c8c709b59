"""Engine warm-up: compile, before the first request, the kernel variants serving would compile inside one.

Triton compiles a kernel variant the first time a launch needs it: one per set of constexprs (a selection's
tile, split, ...) and per specialisation of the integer arguments (1, a multiple of 16, other). An engine
serving online meets new variants as its steps' token counts, sequence counts and context lengths vary, and
the step that meets one stalls while it compiles: 0.2-0.8 s each on the H200, one to four in a timed Poisson
serve of 64 requests after two untimed ones, in every arm (docs/BENCHMARKS.md, session 31). Stock engines
warm up at start for the same reason (vLLM and SGLang capture their decode graphs and run dummy prefills).

`warmup` runs the engine's own step path (`Engine._step`: forward, LM head, sampler) over synthetic steps,
one per class of steps the kernels tell apart, and captures every decode graph (and, with `step_graphs`, the
pieces of every padded step size: `rollout/step_graphs.py`, or with `full_steps` each size's whole-step graph:
`rollout/full_steps.py`; its linears then see the padded count). A step's
class is what its launches compile for: the attention selection of its shape (sequences, longest query,
tokens, longest context), each pinned linear site's selection at its token count, and Triton's specialisation
of the token and sampled-row counts and of the page table's width. Candidate steps sweep the token counts up to the
step budget and the context lengths up to the deployment's in 64-position steps, each at a table width of
each class, and a chunk beside every count of decode rows at each length; only a class not met before runs.
With pinned selections that is a few dozen steps. The stock arm's split count reads the sequences, the longest
query and the context length (FlashAttention's heuristic); the split size and count are runtime arguments of
its kernels (the size was a constexpr for every arm until session 36: the 1.5B's stock serve then compiled 3-6
variants of the attention and its combine inside the timed Poisson run, 0.8-1.1 s stalls), so a class is the
count's specialisation, not its value. A pinned arm's one split size is compiled in (`fixed_split`, session 54:
11-13 µs a batch-1 step), so it is part of the class, one value a deployment.

The synthetic steps write keys into the cache's pages, which no request has yet (warm-up needs an idle
engine and flushes the prefix cache after): a request's pages are written by that request before it reads
them, so warm-up changes no request's bits (tests/test_engine_warmup.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from detent_rl.kernels.launch import counting_compiles
from detent_rl.kernels.matmul import launch_params
from detent_rl.models.layers import Linear
from detent_rl.rollout.scheduler import Span
from detent_rl.rollout.sequence import SamplingParams, Sequence
from detent_rl.timing import sync

if TYPE_CHECKING:
    from detent_rl.rollout.engine import Engine

LENGTH_STEP = 64  # the context-length sweep's stride: the attention kernels' KV tile


def _ints(n: int) -> tuple[bool, bool]:
    """How Triton specialises an integer argument: equal to 1, divisible by 16."""
    return n == 1, n % 16 == 0


class _Plan:
    """The classes of steps met so far, and how to tell a new one."""

    def __init__(self, engine: "Engine") -> None:
        model = engine.model
        self.model = model
        # the pinned linear sites (the stock arm's are cuBLAS: nothing to compile), the LM head apart: it runs on
        # the sampled rows, not the step's tokens
        self.linears = {}
        for module in model.modules():
            if isinstance(module, Linear) and not module._stock and module is not model.lm_head:
                self.linears.setdefault(tuple(module.weight.shape), module._select)
        self.head = None if model.lm_head._stock else model.lm_head._select
        self.logprobs = engine._select_logprobs
        self.steps = engine.steps  # piecewise graphs: the linears run at the padded token count
        self.heads = model.num_heads  # this rank's query heads: the attention partials' row stride is heads x splits
        self.seen: set = set()

    def key(self, q_lens: list[int], cached: list[int], width: int) -> tuple:
        tokens, rows = sum(q_lens), len(q_lens)
        selection = self.model.select_attention(rows, max(q_lens), tokens, max(c + n for c, n in zip(cached, q_lens)))
        # what the attention kernels compile for: the selection's constexprs; the split count is a runtime argument
        # (as the partials' strides, H x splits and splits, which Triton specialises), the split size one too in
        # the stock arm and a constexpr in a pinned one (`layers.Attention`: `paged_attention(fixed_split=)`; the
        # selection gives one size: a class of its own)
        splits = selection.num_splits
        size = selection.split_size if self.model.selections.pinned else None
        attention = (tuple(v for f, v in selection._asdict().items() if f not in ("num_splits", "split_size")),
                     _ints(splits), _ints(self.heads * splits), size)
        padded = self.steps.size_for(tokens) if self.steps is not None and self.steps.fits(tokens) else tokens
        linears = tuple(tuple(launch_params(select(padded)).values()) for select in self.linears.values())
        head = tuple(launch_params(self.head(rows)).values()) if self.head is not None else ()
        # the page table's row stride (its widest row) is an integer argument of the attention kernel
        return attention, _ints(tokens), _ints(padded), _ints(rows), _ints(width), linears, head, self.logprobs(rows)

    def new(self, q_lens: list[int], cached: list[int], width: int) -> bool:
        key = self.key(q_lens, cached, width)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def table_widths(need: int, most: int) -> list[int]:
    """Page-table widths (pages a row) to try for a step whose longest sequence needs `need` pages: a request's
    table covers its whole sequence, not only the step's tokens, so its width may be any of Triton's classes
    at or above `need` (one of each: `need`, a multiple of 16, another), within the `most` pages there are."""
    out = [need]
    if need % 16:
        out.append(-(-need // 16) * 16)
    if need == 1 or need % 16 == 0:
        out.append(need + 1 if (need + 1) % 16 else need + 2)
    return [w for w in out if w <= most]


def candidate_steps(max_tokens: int, max_rows: int, max_len: int, chunk: int) -> list[tuple[list[int], list[int]]]:
    """(query lengths, cached lengths) of the steps a warm-up may run, in order: prefills of every token count
    up to the step budget in `chunk`-token sequences (chunked prefill's shape); `rows` two-token prefills for
    every sampled-row count; and at every context length (a `LENGTH_STEP` stride) a two-token step, a chunk,
    and a chunk beside a decode row, as an online step mixes them. Lengths within `max_len`."""
    chunk = max(1, min(chunk, max_len))
    out = []
    for tokens in range(1, max_tokens + 1):
        full, rest = divmod(tokens, chunk)
        if full + (rest > 0) <= max_rows:
            q = [chunk] * full + ([rest] if rest else [])
            out.append((q, [0] * len(q)))
    out += [([2] * rows, [0] * rows) for rows in range(1, min(max_rows, max_tokens // 2) + 1) if max_len >= 2]
    for length in range(LENGTH_STEP, max_len + 1, LENGTH_STEP):
        c = min(chunk, length)
        out.append(([2], [length - 2]))
        out.append(([c], [length - c]))
        # a chunk beside every count of decode rows (the stock selection's KV split reads the sequences)
        for rows in range(2, min(max_rows, max_tokens - c + 1) + 1):
            out.append(([c] + [1] * (rows - 1), [length - c] + [length - 1] * (rows - 1)))
    return out


def planned_steps(engine: "Engine") -> list[tuple[list[int], list[int], int]]:
    """(query lengths, cached lengths, page-table width) of the steps `warmup` runs: the first candidate step
    (`candidate_steps`, at each of `table_widths`) of every class."""
    page = engine.model.page_size
    # a request's table holds at most its deployment's context of pages, and the cache's
    pages = min(len(engine.blocks.blocks), -(-engine.model.selections.deployment.max_context // page))
    max_len = min(engine.model.max_positions - 1, pages * page)  # one position left for the sampled token
    plan, out = _Plan(engine), []
    for q_lens, cached in candidate_steps(engine.scheduler.max_num_tokens, engine.scheduler.max_num_seqs, max_len,
                                          engine.scheduler.chunk_size):
        for width in table_widths(max(-(-(c + n) // page) for c, n in zip(cached, q_lens)), pages):
            if plan.new(q_lens, cached, width):
                out.append((q_lens, cached, width))
    return out


def synthetic_spans(engine: "Engine", q_lens: list[int], cached: list[int], width: int) -> list[Span]:
    """A step of synthetic sequences for `engine._step`: sequence i computes `q_lens[i]` tokens after `cached[i]`
    (their keys written into pages 0..`width` - 1, which every such sequence shares), each sampling its last."""
    vocab, page = engine.model.config.vocab_size, engine.model.page_size
    spans = []
    for i, (n, c) in enumerate(zip(q_lens, cached)):
        seq = Sequence([(7 * i + j) % vocab for j in range(c + n)], SamplingParams(seed=i), page)
        seq.block_table = list(range(width))
        spans.append(Span(seq, c, n, True))
    return spans


def warmup(engine: "Engine", temperatures: tuple[float | None, ...] = (1.0,)) -> dict:
    """Run one synthetic step of every step class (`planned_steps`) and capture every decode graph size at each
    of `temperatures` (the graphs that sample: a request's temperature, greedy as 1.0; None: the graphs that
    return logits, which rows with top-k or top-p filtering take), and every step-graph size. Needs an idle
    engine; flushes its prefix cache. Returns {"steps", "graphs" (captured: decode graphs and step sizes),
    "compiled" (Triton kernel variants), "seconds"}."""
    if not engine.idle:
        raise RuntimeError("warmup needs an idle engine: call it before the first request, or between generate calls")
    t0 = time.perf_counter()
    if engine.released:
        engine._resume_memory()
    model = engine.model
    steps = planned_steps(engine)
    with torch.inference_mode(), counting_compiles() as compiled:
        for q_lens, cached, width in steps:
            engine._step(synthetic_spans(engine, q_lens, cached, width))
        graphs = 0
        if engine.steps is not None:  # every step-graph size, beyond those the steps met
            graphs += engine.steps.warm()
        if engine.graphs is not None and engine.graphs.capture:
            for t in temperatures:
                for b in engine.graphs.sizes:
                    if (b, t) not in engine.graphs.graphs:
                        engine.graphs._capture((b, t))
                        graphs += 1
    sync(model.device)
    engine.flush_cache()
    return {"steps": len(steps), "graphs": graphs, "compiled": len(compiled), "seconds": time.perf_counter() - t0}
