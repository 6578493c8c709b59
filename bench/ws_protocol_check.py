"""Model check of `bench/gemm_ws_probe.py`'s barrier protocol on the CPU, before a GPU call risks a hang on it.

    python bench/ws_protocol_check.py [--seeds 3] [--mutation none|no-fold-release|short-count|long-lag]

The kernel's partitions talk only through mbarriers: the loader waits on a slot's `empty` barrier (parity flipped, so
a fresh barrier passes) and arms its `ready` barrier with the TMA bytes; each of the HALVES warpgroups waits on
`ready`, frees the slot of the block before once its MMA is done (at a chunk's first block the fold has freed it), and
frees the last block at a tile's end; warpgroup R waits once on `starts[R - 1]`, which warpgroup R - 1 arrives on
after LAG blocks. This replays that protocol as Python generators, one per partition, with an mbarrier model (a phase
completes when its count of arrivals is in; a wait on parity P passes once a phase of parity P has completed) and
TMA copies that land at random later times, under random interleavings, over rings of 2-6 slots, every lag the ring
allows, K whole and chunked, one tile or several per program. It asserts that no partition deadlocks, that every
warpgroup reads the block it expects from a slot, that the loader overwrites a slot only once every warpgroup freed
its block, and that every block is freed by every warpgroup. `--mutation` breaks the protocol one way (the fold's
release dropped; an `empty` count one short; a lag past what the ring holds) and must then report failures: the
check's own control. The model follows the kernel's code by hand; change both together.
"""
from __future__ import annotations

import argparse
import itertools
import random


class Barrier:
    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count"
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def passed(self, parity: int) -> bool:
        """mbarrier.try_wait.parity: the phase of that parity has completed."""
        return (self.phase & 1) != parity


def run(tiles: list[int], chunks: int, chunk_blocks: int, ring: int, lag: int, halves: int, rng: random.Random,
        mutation: str = "none") -> str:
    num_k = chunks * chunk_blocks
    ready = [Barrier(1) for _ in range(ring)]
    empty = [Barrier(halves - (mutation == "short-count")) for _ in range(ring)]
    starts = [Barrier(1) for _ in range(halves - 1)]
    in_slot: list = [None] * ring
    freed: dict[int, set] = {}
    copies: list[int] = []  # slots whose TMA copies are in flight
    my_blocks = len(tiles) * num_k

    def free(r: int, block: int) -> None:
        assert in_slot[block % ring] == block, f"warpgroup {r} freed block {block}, which its slot no longer holds"
        freed.setdefault(block, set()).add(r)
        empty[block % ring].arrive()

    def loader():
        for i in range(my_blocks):
            slot = i % ring
            yield empty[slot], ((i // ring) & 1) ^ 1
            if in_slot[slot] is not None:
                assert freed.get(in_slot[slot]) == set(range(halves)), f"block {i} overwrote a slot still in use"
            in_slot[slot] = i
            copies.append(slot)

    def warpgroup(r: int):
        if r > 0 and lag > 0:
            yield starts[r - 1], 0
        i = 0
        for _ in tiles:
            for kb in range(num_k):
                slot, j = i % ring, kb % chunk_blocks
                if chunks > 1 and j == 0 and kb > 0 and mutation != "no-fold-release":
                    free(r, i - 1)  # the fold waited for the chunk's MMAs
                yield ready[slot], (i // ring) & 1
                assert in_slot[slot] == i, f"warpgroup {r} read block {in_slot[slot]} for {i}"
                if j != 0:
                    free(r, i - 1)  # at most this block's MMA outstanding
                if r < halves - 1 and lag > 0 and i == min(my_blocks, lag) - 1:
                    starts[r].arrive()
                i += 1
                yield None
            free(r, i - 1)  # the tile's end waits for all

    parts = [loader()] + [warpgroup(r) for r in range(halves)]
    waiting: list = [None] * len(parts)
    live = set(range(len(parts)))
    while live:
        while copies and rng.random() < 0.5:  # copies land some time later
            ready[copies.pop(0)].arrive()
        runnable = [k for k in live if waiting[k] is None or waiting[k][0].passed(waiting[k][1])]
        if not runnable:
            if copies:
                ready[copies.pop(0)].arrive()
                continue
            return f"deadlock: partitions {sorted(live)} all waiting"
        k = rng.choice(runnable)
        waiting[k] = None
        try:
            step = next(parts[k])
        except StopIteration:
            live.discard(k)
            continue
        if step is not None and not step[0].passed(step[1]):
            waiting[k] = step
    missing = [b for b in range(my_blocks) if freed.get(b) != set(range(halves))]
    return f"blocks {missing[:4]} not freed by every warpgroup" if missing else "ok"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--mutation", default="none", choices=("none", "no-fold-release", "short-count", "long-lag"))
    args = ap.parse_args(argv)
    runs, bad = 0, []
    shapes = [(1, 8), (8, 10), (5, 28), (2, 2), (3, 2)]  # (chunks, K blocks a chunk): K whole and the partitions
    programs = [(1, 1, 0), (7, 2, 1), (12, 5, 4), (3, 3, 0)]  # (tiles, programs, this program)
    for halves, ring in itertools.product((2, 3), range(2, 7)):
        lags = range(ring + 3) if args.mutation == "long-lag" else \
            [g for g in range(ring + 1) if g * (halves - 1) <= ring]  # gemm_ws_probe.meta's bound
        for lag, (chunks, blocks), (num_tiles, nprog, pid), seed in itertools.product(
                lags, shapes, programs, range(args.seeds)):
            runs += 1
            try:
                verdict = run(list(range(pid, num_tiles, nprog)), chunks, blocks, ring, lag, halves,
                              random.Random(seed), args.mutation)
            except AssertionError as e:
                verdict = f"assertion: {e}"
            if verdict != "ok":
                bad.append((dict(halves=halves, ring=ring, lag=lag, chunks=chunks, blocks=blocks, tiles=num_tiles,
                                 programs=nprog), verdict))
    print(f"{runs} schedules, {len(bad)} failed (mutation: {args.mutation})")
    for case, verdict in bad[:3]:
        print("  ", case, verdict)
    if args.mutation == "none" and bad:
        raise SystemExit(1)
    if args.mutation != "none" and not bad:
        raise SystemExit(f"the mutation {args.mutation} went unseen: the check is too weak")


if __name__ == "__main__":
    main()
