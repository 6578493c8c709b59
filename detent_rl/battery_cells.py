"""The battery's cells: each names a target request's reference batch state and a changed one.

`build_cells` draws the 36 cells (26 of the DETENT evaluation, 9 strong, one rollout-vs-rescore)
for a model's vocabulary and page size from fixed seeds, so every arm and device runs the same
requests; `detent_rl.battery` runs and judges them (its docstring lists the groups).
"""
from __future__ import annotations

import fnmatch
import random
from dataclasses import dataclass
from typing import Optional

from detent_rl.rollout.sequence import SamplingParams

NUM_COMPARED = 16  # output logprobs compared per run, as in the paper
PREFIX_BLOCKS = 6  # the target's prompt has this many full pages (plus a partial one)


class BatteryError(ValueError):
    """A battery that cannot run as asked: an unknown arm, model or cell, a missing device."""


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class Run:
    """One batch state for the target: earlier `generate` calls on the same engine (their full
    blocks stay in the prefix cache, their pages go back dirty), then one call of `neighbours` with
    the target inserted at `row`, under the given engine limits. `expect_cached` is the prefix hit
    the target's allocation must find (None: not checked); `rescore` replaces the rollout's
    logprobs by the trainer's one-shot prefill of the finished sequence."""
    neighbours: tuple[Request, ...] = ()
    row: int = 0
    before: tuple[tuple[Request, ...], ...] = ()
    chunk_size: Optional[int] = None  # None: the step budget
    max_num_tokens: Optional[int] = None  # None: the battery's step budget
    max_num_seqs: int = 64
    num_blocks: Optional[int] = None  # None: enough that nothing is preempted or evicted
    expect_cached: Optional[int] = 0
    rescore: bool = False
    attempt: int = 0  # tells two reruns of one batch state apart


@dataclass(frozen=True)
class Cell:
    name: str
    group: str
    what: str
    reference: Run
    changed: Run


GROUPS = ("rerun", "cobatch", "row", "prefix", "strong", "rescore")


def target_prompt(vocab: int, page_size: int, seed: int = 0) -> tuple[int, ...]:
    """PREFIX_BLOCKS full pages and 5 tokens more, so prefix cells can hit 1..PREFIX_BLOCKS blocks."""
    rng = random.Random(f"target/{seed}")
    return tuple(rng.randrange(vocab) for _ in range(PREFIX_BLOCKS * page_size + 5))


def build_cells(vocab: int, page_size: int, seed: int = 0) -> list[Cell]:
    """The battery's cells for a model of `vocab` tokens and `page_size`-token pages."""
    rng = random.Random(f"cells/{seed}")
    target = target_prompt(vocab, page_size, seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab) for _ in range(n))

    def params(max_tokens: Optional[int] = None) -> SamplingParams:
        return SamplingParams(seed=rng.randrange(2**31), temperature=rng.choice([0.0, 0.7, 1.0]),
                              top_k=rng.choice([0, 20]), top_p=rng.choice([1.0, 0.9]),
                              max_tokens=max_tokens or rng.randint(1, 24))

    def requests(n: int, kind: str = "short", max_tokens: Optional[int] = None) -> tuple[Request, ...]:
        lengths = {"short": (4, 24), "long": (160, 320), "mixed": (4, 320)}[kind]
        return tuple(Request(tokens(rng.randint(*lengths)), params(max_tokens)) for _ in range(n))

    def sharing(blocks: int) -> Request:  # the target's first `blocks` pages, then tokens it lacks
        cut = blocks * page_size
        tail = tuple((t + 1) % vocab for t in target[cut:cut + 7])
        return Request(target[:cut] + tail, params(2))

    alone = Run()
    batch8, batch16 = requests(7, "mixed"), requests(15, "mixed")
    cells = [
        Cell("rerun-alone", "rerun", "the target alone, run again", alone, Run(attempt=1)),
        Cell("rerun-batch16", "rerun", "a 16-request batch, run again",
             Run(batch16, row=5), Run(batch16, row=5, attempt=1)),
    ]
    cobatch = [
        ("1-short", "one short neighbour", Run(requests(1))),
        ("3-short", "three short neighbours", Run(requests(3), row=1)),
        ("7-mixed", "seven neighbours of mixed length", Run(batch8)),
        ("15-mixed", "fifteen neighbours of mixed length", Run(batch16, row=5)),
        ("31-short", "31 short neighbours: a decode batch of 32", Run(requests(31, max_tokens=24), row=9)),
        ("1-long", "a 300-token neighbour prefilled alongside", Run((Request(tokens(300), params(16)),))),
        ("same-prompt", "three neighbours with the target's prompt and other seeds",
         Run(tuple(Request(target, params(16)) for _ in range(3)))),
        ("early-finish", "seven neighbours that stop after 1-3 tokens: the batch shrinks",
         Run(tuple(Request(tokens(rng.randint(4, 40)), params(rng.randint(1, 3))) for _ in range(7)), row=3)),
        ("late-join", "two sequence slots: nine neighbours join one by one while the target decodes",
         Run(requests(9, "mixed", max_tokens=3), max_num_seqs=2)),
        ("chunked", "the target alone, prefilled in 16-token chunks", Run(chunk_size=16)),
        ("budget", "a 24-token step budget shared with three neighbours admitted first",
         Run(requests(3, "mixed", max_tokens=20), row=3, max_num_tokens=24)),
        ("admitted-late", "admitted behind three 120-token prefills under a 64-token budget",
         Run(tuple(Request(tokens(120), params(20)) for _ in range(3)), row=3, max_num_tokens=64)),
        ("dirty-pages", "after 4 other requests on the same engine: its pages held their keys",
         Run(before=tuple((Request(tokens(rng.randint(60, 100)), params(8)),) for _ in range(4)),
             num_blocks=-(-(len(target) + NUM_COMPARED) // page_size))),
        ("prefix-in-flight", "a request ahead shares its 6 full blocks, prefilling them in 32-token chunks",
         Run((Request(target[:PREFIX_BLOCKS * page_size] + tokens(150), params(4)),), row=1, chunk_size=32,
             expect_cached=None)),
    ]
    cells += [Cell(f"cobatch-{n}", "cobatch", what, alone, run) for n, what, run in cobatch]
    cells += [Cell(f"row-{r}", "row", f"the 8-request batch with the target at row {r}, not 0",
                   Run(batch8), Run(batch8, row=r)) for r in (1, 3, 5, 7)]
    cells += [Cell(f"prefix-{b}", "prefix", f"{b} block(s) ({b * page_size} tokens) of its prompt cached",
                   alone, Run(before=((sharing(b),),), expect_cached=b * page_size))
              for b in range(1, PREFIX_BLOCKS + 1)]
    for n in (1, 8, 32):
        for kind in ("short", "long", "mixed"):
            cells.append(Cell(f"strong-{n}-{kind}", "strong", f"{n} {kind} neighbour(s), the target at a random row",
                              alone, Run(requests(n, kind), row=rng.randint(0, n))))
    cells.append(Cell("rescore", "rescore", "the rollout's logprobs vs the trainer's one-shot prefill",
                      alone, Run(rescore=True)))
    return cells


def select_cells(cells: list[Cell], patterns: Optional[str]) -> list[Cell]:
    """Cells whose name or group matches one of the comma-separated glob patterns (all if None)."""
    if not patterns:
        return cells
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    unmatched = [p for p in pats if not any(fnmatch.fnmatch(c.name, p) or c.group == p for c in cells)]
    if unmatched:
        raise BatteryError(f"--cells {unmatched} match no cell; groups: {', '.join(GROUPS)}; "
                           f"cells: {', '.join(c.name for c in cells)}")
    return [c for c in cells if any(fnmatch.fnmatch(c.name, p) or c.group == p for p in pats)]


def concurrency(cells: list[Cell]) -> int:
    """The most requests the cells' engines hold at once (their slots, the reference run's included): the
    deployment CoRun serves, whose maximum concurrency is its one padded decode shape (as the bench sets it)."""
    return max([Run().max_num_seqs] + [r.max_num_seqs for c in cells for r in (c.reference, c.changed)])
