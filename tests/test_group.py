"""Worker groups in-process (the Ray form runs in test_train.py): one result per worker in order, a
handle passed on as an argument reaches the other group's workers, call_one needs one worker."""
from __future__ import annotations

import pytest

from detent_rl.group import WorkerGroup


class Counter:
    made = 0

    def __init__(self, start: int) -> None:
        Counter.made += 1
        self.value, self.index = start, Counter.made

    def add(self, n: int) -> int:
        self.value += n
        return self.value

    def who(self) -> int:
        return self.index


def test_inline_group_calls_every_worker_and_passes_handles_on():
    Counter.made = 0
    producers, consumers = WorkerGroup(Counter, 10), WorkerGroup(Counter, 0, size=3)
    assert len(consumers) == 3 and consumers.call("who") == [2, 3, 4]
    handles = producers.async_call("add", 5)  # inline: the value itself
    assert consumers.call("add", *handles) == [15, 15, 15]
    assert producers.call_one("add", 1) == 16
    with pytest.raises(ValueError, match="Counter group has 3 workers; call_one needs exactly one"):
        consumers.call_one("who")
    with pytest.raises(ValueError, match="at least one worker"):
        WorkerGroup(Counter, 0, size=0)
