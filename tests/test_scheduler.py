"""Continuous batching: chunked prefill within the token budget, decode, admission, preemption."""
from __future__ import annotations

import random

from detent_rl.rollout.block_manager import BlockManager
from detent_rl.rollout.scheduler import Scheduler
from detent_rl.rollout.sequence import SamplingParams, Sequence, Status


def _run(sched: Scheduler, steps: int = 10_000) -> dict[int, list[tuple[int, int]]]:
    """Drive the scheduler with a fake model; returns every sequence's computed (start, count) spans."""
    seen: dict[int, list[tuple[int, int]]] = {}
    for _ in range(steps):
        if sched.idle:
            return seen
        spans = sched.schedule()
        assert spans, "a step with work must schedule something"
        assert sum(s.count for s in spans) <= sched.max_num_tokens
        assert len({s.seq.seq_id for s in spans}) == len(spans)
        for s in spans:
            seen.setdefault(s.seq.seq_id, []).append((s.start, s.count))
        sched.postprocess(spans, {s.seq.seq_id: (1000 + len(s.seq), -0.5) for s in spans if s.samples})
    raise AssertionError("did not finish")


def test_every_request_is_prefilled_in_chunks_then_decoded():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_tokens=16, chunk_size=8)
    seqs = [Sequence(list(range(100 * i, 100 * i + n)), SamplingParams(seed=i, max_tokens=5), 4)
            for i, n in enumerate((30, 3, 17, 9, 1))]
    for s in seqs:
        sched.add(s)
    seen = _run(sched)
    for s in seqs:
        assert s.status is Status.FINISHED and len(s.completion) == 5
        spans = seen[s.seq_id]
        covered = [p for start, count in spans for p in range(start, start + count)]
        assert covered == list(range(len(s) - 1)), (s.seq_id, spans)  # every position once, in order
        assert all(c <= 8 for _, c in spans)
    assert sched.blocks.num_free == 64


def test_preemption_recomputes_and_finishes_everything():
    rng = random.Random(0)
    sched = Scheduler(BlockManager(10, 4), max_num_seqs=8, max_num_tokens=32, chunk_size=16)
    seqs = [Sequence([rng.randrange(50) for _ in range(rng.randint(1, 12))], SamplingParams(seed=i, max_tokens=8), 4)
            for i in range(8)]
    for s in seqs:
        sched.add(s)
    _run(sched)
    assert all(s.status is Status.FINISHED and len(s.completion) == 8 for s in seqs)
    assert sched.blocks.num_free == 10


def test_stop_tokens_end_a_request():
    sched = Scheduler(BlockManager(8, 4), 2, 8, 8)
    s = Sequence([1, 2, 3], SamplingParams(seed=0, max_tokens=50, stop_token_ids=(1004,)), 4)
    sched.add(s)
    _run(sched)
    assert s.completion == [1003, 1004]


def test_a_prefix_hit_skips_the_cached_blocks():
    sched = Scheduler(BlockManager(32, 4), 4, 64, 64)
    a = Sequence(list(range(20)), SamplingParams(seed=0, max_tokens=2), 4)
    sched.add(a)
    _run(sched)
    b = Sequence(list(range(18)), SamplingParams(seed=1, max_tokens=2), 4)
    sched.add(b)
    first = sched.schedule()
    assert [(s.start, s.count) for s in first] == [(16, 2)]  # blocks 0-3 were a's


def test_a_request_preempted_in_the_running_loop_is_not_scheduled():
    """An older request's decode preempts the newest one, which comes later in the same loop."""
    from detent_rl.rollout.block_manager import BlockManager
    from detent_rl.rollout.scheduler import Scheduler
    from detent_rl.rollout.sequence import SamplingParams, Sequence, Status
    blocks = BlockManager(4, 16)
    sched = Scheduler(blocks, max_num_seqs=8, max_num_tokens=64, chunk_size=8)
    a = Sequence(list(range(16)), SamplingParams(seed=0, max_tokens=4), 16)
    b = Sequence(list(range(100, 140)), SamplingParams(seed=1, max_tokens=4), 16)
    sched.add(a)
    sched.add(b)
    for _ in range(4):
        spans = sched.schedule()
        assert all(s.seq.status is Status.RUNNING and s.seq.block_table for s in spans)
        sched.postprocess(spans, {s.seq.seq_id: (1, -0.5) for s in spans if s.samples})
