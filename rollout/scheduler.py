"""Continuous batching with chunked prefill under a per-step token budget.

Each step decodes every running sequence whose prompt is done (one token each), continues
unfinished prefills in chunks, and admits waiting requests while tokens, sequence slots and
blocks last. A request that cannot get a block for its next token is preempted: its blocks are
freed and it is prefilled again later — with batch-invariant kernels the recomputed keys are the
same bits, so preemption never changes a request's output.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from detent_rl.rollout.block_manager import BlockManager
from detent_rl.rollout.sequence import Sequence, Status


@dataclass(slots=True)
class Span:
    """`count` tokens of `seq` starting at absolute position `start`, computed in one step; `samples`:
    whether the span ends at the sequence's newest token (its logits pick the next one).

    Made per running sequence per step, so a plain slotted record: a frozen dataclass would set each
    field through object.__setattr__ (1.7x the cost to make), and nothing changes a span once made."""
    seq: Sequence
    start: int
    count: int
    samples: bool


def _chunk(seq: Sequence, n: int) -> Span:
    """The next `n` uncomputed tokens of seq."""
    return Span(seq, seq.num_computed, n, seq.num_computed + n == len(seq))


class Scheduler:
    """`isolated_prefill` (the CoRun arm): a step is either one request's whole prefill, alone, or a
    decode step of every running sequence — never a mix, never a chunk — so a prefill's shape is its
    request's own, and a decode step's is the running set's."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_tokens: int, chunk_size: int,
                 isolated_prefill: bool = False) -> None:
        if max_num_seqs < 1 or max_num_tokens < 1 or chunk_size < 1:
            raise ValueError("max_num_seqs, max_num_tokens and chunk_size must be positive")
        self.isolated_prefill = isolated_prefill
        self.blocks = blocks
        self.max_num_seqs, self.max_num_tokens, self.chunk_size = max_num_seqs, max_num_tokens, chunk_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if seq.num_blocks > len(self.blocks.blocks):
            raise ValueError(f"request of {len(seq)} tokens needs {seq.num_blocks} blocks; the cache has "
                             f"{len(self.blocks.blocks)}")
        self.waiting.append(seq)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> list[Span]:
        if self.isolated_prefill:
            return self._schedule_isolated()
        spans: list[Span] = []
        budget = self.max_num_tokens
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop for an older request
                continue
            if seq.num_computed < len(seq) - 1:  # an unfinished prefill: the next chunk
                n = min(self.chunk_size, len(seq) - seq.num_computed, budget)
                spans.append(_chunk(seq, n))
                self.blocks.cache_computed(seq, seq.num_computed + n)
                budget -= n
                continue
            self._decode(seq, spans)
            if seq.status is Status.RUNNING:
                budget -= 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = min(self.chunk_size, len(seq) - seq.num_computed, budget)
            spans.append(_chunk(seq, n))
            self.blocks.cache_computed(seq, seq.num_computed + n)  # later admissions may share them
            budget -= n
        return spans

    def _schedule_isolated(self) -> list[Span]:
        if self.waiting and len(self.running) < self.max_num_seqs and self.blocks.can_allocate(self.waiting[0]):
            seq = self.waiting.popleft()
            if len(seq) > self.max_num_tokens:
                raise ValueError(f"an isolated prefill of {len(seq)} tokens exceeds the step budget "
                                 f"max_num_tokens {self.max_num_tokens}")
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            return [_chunk(seq, len(seq) - seq.num_computed)]
        spans: list[Span] = []
        for seq in list(self.running):
            if seq.status is Status.RUNNING:
                self._decode(seq, spans)
        return spans

    def _decode(self, seq: Sequence, spans: list[Span]) -> None:
        """Append seq's decode span to `spans`; when the cache is full, the newest requests are
        preempted (their spans dropped) until seq can grow, seq itself last."""
        while not self.blocks.can_append(seq):  # free a block by preempting the newest request
            victim = self.running[-1]
            self._preempt(victim)
            spans[:] = [s for s in spans if s.seq is not victim]
            if victim is seq:
                return
        self.blocks.may_append(seq)
        spans.append(Span(seq, len(seq) - 1, 1, True))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.deallocate(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def schedule_ahead(self, spans: list[Span]) -> list[Span] | None:
        """The next step, scheduled while `spans` — a decode step of every running sequence, whose
        tokens are still on the device — runs: the same sequences in the same order, each one token on
        (its place kept by `Sequence.hold`), less those the step's token completes by length. None
        (and nothing changed) where the next step could differ otherwise: requests waiting to be
        admitted, a running sequence not in the step, or too few free blocks (a preemption). A
        sequence that samples a stop token is in the step ahead all the same (its row there is
        discarded); one that has finished (`spans` was itself scheduled ahead of its stop) is left out."""
        if self.waiting:
            return None
        going, need, running = [], 0, 0
        for span in spans:
            seq = span.seq
            if seq.status is not Status.RUNNING:  # finished on a stop token: its row here is discarded
                continue
            running += 1
            if span.count != 1 or not span.samples:
                return None
            if len(seq.tokens) + 1 - len(seq.prompt) >= seq.params.max_tokens:
                continue  # its step's token is its last
            going.append(seq)
            need += len(seq.tokens) // seq.block_size >= len(seq.block_table)  # its next position opens a block
        if running != len(self.running) or need > len(self.blocks.free):
            return None
        ahead = []
        for seq in going:
            seq.hold()
            self.blocks.may_append(seq)
            ahead.append(Span(seq, len(seq.tokens) - 1, 1, True))
        return ahead

    def postprocess(self, spans: list[Span], tokens: dict[int, tuple[int, float]]) -> list[Sequence]:
        """Record the computed spans and the sampled (token, logprob) of sampling spans by seq_id;
        returns the sequences that finished. A span of a sequence that finished meanwhile (a step
        scheduled ahead of its stop token) is dropped."""
        done = []
        for span in spans:
            seq = span.seq
            if seq.status is not Status.RUNNING:
                continue
            seq.num_computed = span.start + span.count
            if not span.samples:
                continue
            token, logprob = tokens[seq.seq_id]
            seq.append(token, logprob)
            if seq.finished:
                seq.status = Status.FINISHED
                self.running.remove(seq)
                self.blocks.deallocate(seq)
                done.append(seq)
        return done
