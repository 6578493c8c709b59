"""detent_rl.host_phases: named functions timed for a block and restored after."""
import time

import pytest

from detent_rl import host_phases as hp
from detent_rl.host_phases import host_phases


class _Thing:
    def work(self, x):
        time.sleep(0.002)
        return x + 1

    @staticmethod
    def helper(x):
        return 2 * x


def test_counts_calls_and_inclusive_time_and_restores():
    method, helper = _Thing.work, _Thing.__dict__["helper"]
    targets = [f"{__name__}:_Thing.work", f"{__name__}:_Thing.helper", "detent_rl.host_phases:_resolve"]
    with host_phases(targets) as phases:
        t = _Thing()
        assert [t.work(1), t.work(2), _Thing.helper(3), t.helper(4)] == [2, 3, 6, 8]
        hp._resolve("detent_rl.host_phases:Phases")
    assert phases.calls == {targets[0]: 2, targets[1]: 2, targets[2]: 1}
    assert phases.seconds[targets[0]] >= 0.004
    assert _Thing.work is method and _Thing.__dict__["helper"] is helper
    table = phases.table(2).splitlines()
    assert table[2].startswith(f"| {targets[0]} | 1 |")


def test_an_inherited_method_is_timed_and_restored():
    """torch.Tensor.to is its C base's: wrapped on Tensor for the block, then deleted there again."""
    import torch

    target = "torch:Tensor.to"
    with host_phases([target]) as phases:
        torch.zeros(2).to(torch.float64)
    assert phases.calls[target] == 1 and "to" not in torch.Tensor.__dict__
    assert torch.zeros(1).to(torch.float64).dtype == torch.float64


def test_restores_after_the_block_raises():
    method = _Thing.work
    with pytest.raises(RuntimeError, match="inside"):
        with host_phases([f"{__name__}:_Thing.work"]):
            assert _Thing.work is not method
            raise RuntimeError("inside")
    assert _Thing.work is method


def test_bad_targets_name_what_is_wrong():
    with pytest.raises(ValueError, match="expected 'module:attr'"):
        with host_phases(["detent_rl.host_phases"]):
            pass
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        with host_phases([f"{__name__}:_Thing.nope"]):
            pass
    assert "nope" not in _Thing.__dict__
