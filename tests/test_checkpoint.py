"""Checkpoints: atomic save, newest-N retention, and every kind of corruption refused by name."""
from __future__ import annotations

import pytest
import torch

from detent_rl import checkpoint
from detent_rl.checkpoint import CheckpointCorrupt


def _state(step: int) -> dict:
    return {"step": step, "w": torch.arange(10, dtype=torch.float32) * step, "rng": (3, [1, 2], "x")}


def test_save_latest_load_and_keep(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    for step in (2, 4, 6):
        checkpoint.save(tmp_path, step, _state(step), keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000004", "step_000006"]
    step, state = checkpoint.load(checkpoint.latest(tmp_path))
    assert step == 6 and torch.equal(state["w"], _state(6)["w"]) and state["rng"] == (3, [1, 2], "x")


def test_a_leftover_temporary_directory_is_ignored_and_cleaned(tmp_path):
    checkpoint.save(tmp_path, 1, _state(1))
    partial = tmp_path / "checkpoints" / ".step_000002.tmp999"
    partial.mkdir()
    (partial / "state.pt").write_bytes(b"half")
    assert checkpoint.latest(tmp_path).name == "step_000001"
    checkpoint.save(tmp_path, 3, _state(3))
    assert not partial.exists()


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "state.pt").write_bytes((d / "state.pt").read_bytes()[:-7]), "partial write"),
    (lambda d: (d / "state.pt").write_bytes(b"x" * (d / "state.pt").stat().st_size), "does not match its sha256"),
    (lambda d: (d / "state.pt").unlink(), "state.pt is missing"),
    (lambda d: (d / "manifest.json").write_text("{"), "unreadable manifest.json"),
])
def test_corruption_is_reported_never_loaded(tmp_path, damage, message):
    path = checkpoint.save(tmp_path, 5, _state(5))
    damage(path)
    with pytest.raises(CheckpointCorrupt, match=message) as e:
        checkpoint.load(path)
    assert "step_000005" in str(e.value)
