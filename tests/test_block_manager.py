"""Paged blocks: reference counts, prefix hits on full blocks only, reuse after free, decode growth."""
from __future__ import annotations

import pytest

from detent_rl.rollout.block_manager import BlockManager
from detent_rl.rollout.sequence import SamplingParams, Sequence

P = SamplingParams(seed=1, max_tokens=8)


def seq(tokens: list[int], block_size: int = 4) -> Sequence:
    return Sequence(list(tokens), P, block_size)


def test_allocate_and_free_restore_every_block():
    bm = BlockManager(8, 4)
    a = seq(range(10))
    bm.allocate(a)
    assert len(a.block_table) == 3 and bm.num_free == 5 and a.num_cached == 0
    assert bm.slot(a, 9) == a.block_table[2] * 4 + 1
    bm.deallocate(a)
    assert bm.num_free == 8 and a.block_table == []


def computed(bm: BlockManager, s: Sequence, upto: int | None = None) -> None:
    """What the scheduler does when it schedules the step computing s's tokens before `upto`."""
    bm.cache_computed(s, len(s) if upto is None else upto)
    s.num_computed = len(s) if upto is None else upto


def test_shared_prefix_hits_full_blocks_only():
    bm = BlockManager(16, 4)
    a, b = seq([1, 2, 3, 4, 5, 6, 7, 8, 9]), seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    bm.allocate(a)
    computed(bm, a)
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_cached == 8 and b.num_computed == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    c = seq([1, 2, 3, 99, 5, 6, 7, 8])  # differs in the first block: no hit anywhere after it
    bm.allocate(c)
    assert c.num_cached == 0 and not set(c.block_table) & set(a.block_table)


def test_a_group_of_samples_hashes_its_prompt_once_and_other_prompts_afresh():
    """Each full block's hash chains every block before it; a group's samples (the same prompt, allocated in
    a row) reuse the first one's hashes, and a prompt that differs only in its first block gets other hashes
    for every block after it, right after the group (no stale reuse)."""
    from detent_rl.rollout.block_manager import block_hash
    bm = BlockManager(32, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    chain = [block_hash([1, 2, 3, 4], b"")]
    chain.append(block_hash([5, 6, 7, 8], chain[0]))
    group = [seq(prompt) for _ in range(3)]
    for s in group:
        bm.allocate(s)
        computed(bm, s)
    assert [bm.blocks[i].hash for i in group[0].block_table[:2]] == chain
    assert all(s.block_table[:2] == group[0].block_table[:2] and s.num_cached == 8 for s in group[1:])
    other = seq([0, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(other)
    assert other.num_cached == 0 and not set(other.block_table) & set(group[0].block_table)
    assert bm.blocks[other.block_table[1]].hash == block_hash([5, 6, 7, 8], block_hash([0, 2, 3, 4], b"")) != chain[1]


def test_a_whole_cached_prompt_still_recomputes_its_last_token():
    bm = BlockManager(8, 4)
    a, b = seq(range(8)), seq(range(8))
    bm.allocate(a)
    computed(bm, a)
    bm.allocate(b)
    assert b.block_table == a.block_table and b.num_cached == 7


def test_a_block_is_hit_only_once_a_step_computes_it():
    bm = BlockManager(16, 4)
    a, b = seq(range(12)), seq(range(12))
    bm.allocate(a)
    bm.allocate(b)  # nothing of a is scheduled yet: no hit
    assert b.num_cached == 0 and not set(b.block_table) & set(a.block_table)
    bm.deallocate(b)
    computed(bm, a, 6)  # the first chunk (6 tokens) covers block 0 only
    c = seq(range(12))
    bm.allocate(c)
    assert c.num_cached == 4 and c.block_table[0] == a.block_table[0] and c.block_table[1] != a.block_table[1]


def test_a_preempted_requests_uncomputed_blocks_are_forgotten():
    bm = BlockManager(16, 4)
    a = seq(range(12))
    bm.allocate(a)
    bm.cache_computed(a, 12)  # its step is scheduled, then it is preempted before the step runs
    bm.deallocate(a)
    b = seq(range(12))
    bm.allocate(b)
    assert b.num_cached == 0


def test_freed_blocks_keep_their_hash_until_reused():
    bm = BlockManager(4, 4)
    a = seq(range(8))
    bm.allocate(a)
    computed(bm, a)
    bm.deallocate(a)
    b = seq(range(8))
    bm.allocate(b)
    assert b.num_cached == 7 and bm.num_free == 2
    bm.deallocate(b)
    c = seq(range(100, 116))  # needs all four blocks: the old hashes are overwritten
    bm.allocate(c)
    d = seq(range(8))
    assert not bm.can_allocate(d)
    bm.deallocate(c)
    bm.allocate(d)
    assert d.num_cached == 0


def test_decode_opens_blocks_and_hashes_filled_ones():
    bm = BlockManager(8, 4)
    a = seq([1, 2, 3])
    bm.allocate(a)
    for t in (4, 5, 6):
        a.append(t, 0.0)
        assert bm.can_append(a)
        bm.may_append(a)
    assert len(a.block_table) == 2  # positions 0..5
    b = seq([1, 2, 3, 4, 5])
    bm.allocate(b)
    assert b.block_table[0] == a.block_table[0] and b.num_cached == 4  # the block decode filled


def test_errors_are_clear():
    bm = BlockManager(2, 4)
    with pytest.raises(RuntimeError, match="3 blocks needed, 2 free"):
        bm.allocate(seq(range(12)))
    with pytest.raises(ValueError, match="integer seed"):
        SamplingParams(seed=None)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(seed=1, top_p=0.0)
    with pytest.raises(ValueError, match="at least one prompt token"):
        Sequence([], P, 4)
