"""Paged KV-cache blocks with prefix hashing (full blocks only), reference counted.

A cached block's keys were written by whichever request prefilled it first; with batch-invariant
kernels those are the bits this request would have computed, so a prefix hit changes nothing.

A block may be hit only once its keys exist: its hash is registered when a step that computes
its last token is scheduled (`cache_computed`), never at allocation. Within that step every
layer stores the step's keys before it attends, so a request admitted later in the same step
may already share the block; a block whose chunk is still to come (chunked prefill) is not
visible. A preempted request's scheduled-but-uncomputed blocks are unregistered.
"""
from __future__ import annotations

import hashlib
import struct
from collections import deque
from dataclasses import dataclass, field

from detent_rl.rollout.sequence import Sequence


def block_hash(tokens: list[int], prefix: bytes) -> bytes:
    """The hash of a full block: its tokens chained to the hash of every block before it."""
    h = hashlib.blake2b(prefix, digest_size=16)
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))  # each token as 4 little-endian unsigned bytes
    return h.digest()


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: bytes | None = None
    tokens: list[int] = field(default_factory=list)


class BlockManager:
    """`prefix_cache=False`: no block is ever shared (every request computes its whole prompt)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))
        self.by_hash: dict[bytes, int] = {}
        self._hashed: tuple[list[int], list[bytes]] = ([], [])  # the last allocation's tokens and block hashes

    @property
    def num_free(self) -> int:
        return len(self.free)

    def _take(self, block_id: int | None = None) -> Block:
        block = self.blocks[self.free.popleft() if block_id is None else block_id]
        if block_id is not None:
            self.free.remove(block_id)
        if block.hash is not None and self.by_hash.get(block.hash) == block.id:
            del self.by_hash[block.hash]  # its old contents are about to be overwritten
        block.ref_count, block.hash, block.tokens = 1, None, []
        return block

    def can_allocate(self, seq: Sequence) -> bool:
        return self.num_free >= seq.num_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give the sequence pages for its tokens, reusing cached full blocks of its prefix."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"{seq.num_blocks} blocks needed, {self.num_free} free")
        hit = True
        hashes = self._full_block_hashes(seq.tokens) if self.prefix_cache else []
        seq.num_cached = 0
        for i in range(seq.num_blocks):
            tokens = seq.block_tokens(i)
            h = hashes[i] if i < len(hashes) else None  # full blocks only
            cached = self.by_hash.get(h) if h is not None and hit else None
            if cached is not None and self.blocks[cached].tokens == tokens:
                block = self.blocks[cached]
                if block.ref_count == 0:
                    self.free.remove(block.id)
                block.ref_count += 1
                seq.num_cached += self.block_size
            else:
                hit = False  # after the first miss the rest of the prompt is new
                block = self._take()
                if h is not None:  # registered by cache_computed once a step computes it
                    block.hash, block.tokens = h, list(tokens)
            seq.block_table.append(block.id)
        # at least the last prompt token is recomputed: its logits start the decode
        seq.num_cached = min(seq.num_cached, seq.num_prompt - 1)
        seq.num_computed = seq.num_cached

    def _full_block_hashes(self, tokens: list[int]) -> list[bytes]:
        """The chained hash of each full block of `tokens`; the last allocation's when `tokens` equal its
        (a GRPO group's samples share their prompt: seven of its eight allocations hashed it again, ~1 µs a
        block, 3,072 blocks a 32 x 8 batch)."""
        if self._hashed[0] == tokens:
            return self._hashed[1]
        n, prefix, hashes = self.block_size, b"", []
        for i in range(len(tokens) // n):
            prefix = block_hash(tokens[i * n:(i + 1) * n], prefix)
            hashes.append(prefix)
        self._hashed = (list(tokens), hashes)
        return hashes

    def cache_computed(self, seq: Sequence, upto: int) -> None:
        """Register the full blocks whose tokens all lie before `upto` (computed by the scheduled step)."""
        for i in range(min(upto // self.block_size, len(seq.block_table))):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                self.by_hash.setdefault(block.hash, block.id)

    def deallocate(self, seq: Sequence) -> None:
        computed = seq.num_computed // self.block_size  # blocks before this one hold computed keys
        for i in reversed(range(len(seq.block_table))):
            block = self.blocks[seq.block_table[i]]
            block.ref_count -= 1
            if block.ref_count == 0:
                if i >= computed and block.hash is not None:  # scheduled, never computed: not a prefix
                    if self.by_hash.get(block.hash) == block.id:
                        del self.by_hash[block.hash]
                    block.hash, block.tokens = None, []
                self.free.append(block.id)  # keeps its hash until reused: a later prefix may hit
        seq.block_table.clear()
        seq.num_computed = 0  # num_cached stays: how much of the prompt the last allocation found cached

    def can_append(self, seq: Sequence) -> bool:
        """Whether the newest token (position len-1) has a slot, or a free block can give it one."""
        return (len(seq.tokens) - 1) // self.block_size < len(seq.block_table) or bool(self.free)

    def may_append(self, seq: Sequence) -> None:
        """Give the newest token a slot; a block it leaves behind full is hashed for reuse."""
        if (len(seq.tokens) - 1) // self.block_size < len(seq.block_table):  # the common case: room in the last page
            return
        last = self.blocks[seq.block_table[-1]]
        if last.hash is None:  # filled during decode: every one of its keys is computed now
            i = len(seq.block_table) - 1
            prev = self.blocks[seq.block_table[i - 1]].hash if i > 0 else b""
            tokens = seq.block_tokens(i)
            last.hash, last.tokens = block_hash(tokens, prev or b""), tokens
            self.by_hash.setdefault(last.hash, last.id)
        if not self.free:
            raise RuntimeError(f"no free block for sequence {seq.seq_id}")
        seq.block_table.append(self._take().id)

    def flush(self) -> None:
        """Forget every prefix hash; only when no sequence holds a block."""
        held = [b.id for b in self.blocks if b.ref_count]
        if held:
            raise RuntimeError(f"cannot flush the prefix cache: blocks {held[:8]} are in use")
        for b in self.blocks:
            b.hash, b.tokens = None, []
        self.by_hash.clear()

    def slot(self, seq: Sequence, position: int) -> int:
        """The flat cache slot (page * block_size + offset) of a token position."""
        return self.slots([seq], [position])[0]

    def slots(self, seqs: list[Sequence], positions: list[int]) -> list[int]:
        """The flat cache slot of `positions[i]` in `seqs[i]`, for each i."""
        n = self.block_size
        return [q.block_table[p // n] * n + p % n for q, p in zip(seqs, positions)]
