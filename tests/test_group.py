"""Worker groups in-process (the Ray form runs in test_train.py): one result per worker in order, a
handle passed on as an argument reaches the other group's workers, call_one needs one worker."""
from __future__ import annotations

import pytest

from detent_rl.group import WorkerGroup
from detent_rl.workers import GenerateRequest, deal, generate


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
    # each worker its own arguments; a worker given None is not called
    assert consumers.get(consumers.async_each("add", [(1,), None, (3,)])) == [16, 18]
    assert consumers.call("add", 0) == [16, 15, 18]
    with pytest.raises(ValueError, match="3 workers; got 2 argument tuples"):
        consumers.async_each("add", [(1,), (2,)])


def test_requests_are_dealt_by_whole_groups_and_come_back_in_order():
    assert deal(12, 3, 2) == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    assert deal(7, 3, 3) == [[0, 1, 2], [3, 4, 5], [6]]  # a short last group
    assert deal(4, 2, 3) == [[0, 1], [2, 3], []]  # an engine may get nothing
    assert deal(5, 1, 1) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="both must be >= 1"):
        deal(4, 0, 2)

    class Echo:  # an engine that answers each prompt with (engine, prompt)
        made = 0

        def __init__(self) -> None:
            self.me, Echo.made = Echo.made, Echo.made + 1

        def generate(self, request):
            return [(self.me, p) for p in request.prompts]
    request = GenerateRequest([[i] for i in range(7)], [None] * 7)
    got = generate(WorkerGroup(Echo, size=3), request, group_size=2)
    assert [p for _, p in got] == request.prompts  # request order, whatever engine ran it
    assert [e for e, _ in got] == [0, 0, 1, 1, 2, 2, 0]
