"""Checkpoints: parts published whole or not at all, leftovers swept, newest-N retention, every kind of
corruption refused by name with the newest intact checkpoint pointed at, a checkpoint path taken as
given, no checkpoint said plainly; the trainer's streamed state round trip, bit for bit."""
from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from detent_rl import atomic, checkpoint
from detent_rl.checkpoint import DRIVER_PART, TRAINER_PART, CheckpointCorrupt, CheckpointError, NoCheckpoint
from detent_rl.config import TrainSection
from detent_rl.models import load_model
from detent_rl.models.weights import weights_sha256
from detent_rl.trainer.trainer import Sample, Trainer
from test_models import LIMITS, VOCAB, hf_model, save


def _publish(run: Path, step: int, keep: int = 0, scale: float = 1.0) -> Path:
    staged = checkpoint.stage(run, step)
    checkpoint.save_part(staged, TRAINER_PART, {"w": torch.arange(1000, dtype=torch.float32) * step * scale})
    checkpoint.save_part(staged, DRIVER_PART, {"sampler": {"position": step}, "rng": (3, [1, 2], None)})
    return checkpoint.publish(run, step, staged, keep=keep)


def _listing(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def _one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message
    return message


def test_parts_are_published_whole_with_a_manifest(tmp_path):
    staged = checkpoint.stage(tmp_path, 7)
    assert staged.parent == tmp_path / "checkpoints" and staged.name.startswith(".step_000007.")
    checkpoint.save_part(staged, TRAINER_PART, {"w": torch.ones(3)})
    checkpoint.save_part(staged, DRIVER_PART, {"sampler": {"position": 4}})
    assert checkpoint.latest(tmp_path) is None  # staged is not published
    path = checkpoint.publish(tmp_path, 7, staged, keep=2)
    assert path == tmp_path / "checkpoints" / "step_000007" and not staged.exists()
    assert _listing(tmp_path) == ["step_000007"]
    assert sorted(p.name for p in path.iterdir()) == [DRIVER_PART, "manifest.json", TRAINER_PART]
    meta = json.loads((path / "manifest.json").read_text())
    assert meta["format"] == checkpoint.FORMAT == 2 and meta["step"] == 7
    assert sorted(meta["files"]) == [DRIVER_PART, TRAINER_PART]
    assert meta["files"][TRAINER_PART]["bytes"] == (path / TRAINER_PART).stat().st_size
    assert checkpoint.resume_point(tmp_path) == path and checkpoint.step_of(path) == 7
    assert torch.equal(checkpoint.load_part(path, TRAINER_PART)["w"], torch.ones(3))
    assert checkpoint.load_part(path, DRIVER_PART) == {"sampler": {"position": 4}}
    with pytest.raises(CheckpointCorrupt, match=r"has no part optimizer\.pt \(its parts: driver\.pt, trainer\.pt\)"):
        checkpoint.load_part(path, "optimizer.pt")


def test_an_unpublished_or_failed_stage_never_shows_and_is_swept(tmp_path):
    _publish(tmp_path, 1)
    killed = checkpoint.stage(tmp_path, 2)  # a run killed before publish: its parts are all there
    checkpoint.save_part(killed, TRAINER_PART, {"w": torch.zeros(5)})
    checkpoint.save_part(killed, DRIVER_PART, {})
    assert _listing(tmp_path) == [killed.name, "step_000001"]
    assert checkpoint.latest(tmp_path).name == checkpoint.resume_point(tmp_path).name == "step_000001"
    failed = checkpoint.stage(tmp_path, 2)  # the next save sweeps what the killed one left
    assert not killed.exists()
    with pytest.raises(Exception):  # a writer that fails part-way leaves a half-written part
        checkpoint.save_part(failed, TRAINER_PART, {"w": torch.zeros(5), "f": lambda: 0})
    assert (failed / TRAINER_PART).exists()
    assert checkpoint.resume_point(tmp_path).name == "step_000001"
    fresh = checkpoint.stage(tmp_path, 3)
    assert not failed.exists() and _listing(tmp_path) == [fresh.name, "step_000001"]
    checkpoint.save_part(fresh, DRIVER_PART, {})
    checkpoint.publish(tmp_path, 3, fresh)
    assert _listing(tmp_path) == ["step_000001", "step_000003"]


def test_publish_and_save_part_refuse_what_is_not_a_staged_checkpoint(tmp_path):
    staged = checkpoint.stage(tmp_path, 1)
    with pytest.raises(ValueError, match="manifest.json"):
        checkpoint.save_part(staged, "manifest.json", {})
    with pytest.raises(ValueError, match="plain file name"):
        checkpoint.save_part(staged, "../escape.pt", {})
    with pytest.raises(ValueError, match="holds no parts"):
        checkpoint.publish(tmp_path, 1, staged)
    with pytest.raises(ValueError, match="not a staging directory of step 2"):
        checkpoint.publish(tmp_path, 2, staged)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a staging directory"):
        checkpoint.publish(tmp_path, 1, elsewhere)


def test_retention_keeps_the_newest_a_same_step_save_replaces_and_later_steps_go(tmp_path):
    for step in (1, 2, 3, 4):
        _publish(tmp_path, step, keep=2)
    assert _listing(tmp_path) == ["step_000003", "step_000004"]  # nothing hidden left behind either
    again = _publish(tmp_path, 4, keep=2, scale=-1.0)  # a resumed run saving step 4 again
    assert _listing(tmp_path) == ["step_000003", "step_000004"]
    assert checkpoint.load_part(checkpoint.resume_point(again), TRAINER_PART)["w"][1].item() == -4.0
    for step in (5, 6):
        _publish(tmp_path, step, keep=0)  # 0: keep all
    assert _listing(tmp_path) == ["step_000003", "step_000004", "step_000005", "step_000006"]
    _publish(tmp_path, 4, keep=0)  # resumed from step 3 again: the steps after 4 were another trajectory's
    assert _listing(tmp_path) == ["step_000003", "step_000004"]


def _rewrite_manifest(d: Path, **changes) -> None:
    meta = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**meta, **changes}))


DAMAGE = {
    "truncated": (lambda d: (d / TRAINER_PART).write_bytes((d / TRAINER_PART).read_bytes()[:-7]),
                  "trainer.pt has .* bytes, the manifest says .* \\(partial write\\?\\)"),
    "altered": (lambda d: (d / DRIVER_PART).write_bytes(b"x" * (d / DRIVER_PART).stat().st_size),
                "driver.pt does not match its sha256 in the manifest"),
    "part missing": (lambda d: (d / TRAINER_PART).unlink(), "trainer.pt is missing"),
    "manifest garbled": (lambda d: (d / "manifest.json").write_text("{"), "unreadable manifest.json"),
    "manifest missing": (lambda d: (d / "manifest.json").unlink(), "unreadable manifest.json"),
    "manifest entry": (lambda d: _rewrite_manifest(d, files={TRAINER_PART: {"bytes": 1}}), "unreadable manifest.json"),
    "format 1": (lambda d: _rewrite_manifest(d, format=1), "format 1 .*this version reads 2"),
    "wrong step": (lambda d: _rewrite_manifest(d, step=5), "its manifest says step 5"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_corrupt_newest_checkpoint_names_the_newest_intact_one(tmp_path, kind):
    damage, message = DAMAGE[kind]
    for step in (1, 3, 6):
        _publish(tmp_path, step)
    newest, intact = (tmp_path / "checkpoints" / f"step_00000{s}" for s in (6, 3))
    damage(newest)
    with pytest.raises(CheckpointCorrupt, match=message) as e:
        checkpoint.resume_point(tmp_path)
    line = _one_line(e)
    assert line.startswith(f"checkpoint {newest}: ") and "it is not loaded" in line
    assert line.endswith(f"The newest intact checkpoint is {intact}: resume from it with --resume {intact}"), line
    assert checkpoint.resume_point(intact) == intact  # ... and it is


def test_the_pointer_skips_every_damaged_checkpoint_and_says_when_none_is_left(tmp_path):
    for step in (1, 3, 6):
        _publish(tmp_path, step)
    root = tmp_path / "checkpoints"
    (root / "step_000006" / "manifest.json").write_text("{")
    (root / "step_000003" / TRAINER_PART).unlink()
    with pytest.raises(CheckpointCorrupt) as e:
        checkpoint.resume_point(tmp_path)
    assert _one_line(e).endswith(f"resume from it with --resume {root / 'step_000001'}")
    (root / "step_000001" / DRIVER_PART).write_bytes(b"")
    with pytest.raises(CheckpointCorrupt, match=f"No other checkpoint in {root} is intact"):
        checkpoint.resume_point(tmp_path)
    for step in (1, 3):
        atomic.remove_dir(root / f"step_00000{step}")
    with pytest.raises(CheckpointCorrupt, match=f"{root} holds no other checkpoint"):
        checkpoint.resume_point(tmp_path)


def test_a_checkpoint_path_is_taken_as_given_and_verified(tmp_path):
    for step in (3, 6):
        _publish(tmp_path, step)
    root = tmp_path / "checkpoints"
    assert checkpoint.resume_point(root / "step_000003") == root / "step_000003"  # not the newest: as asked
    (root / "step_000003" / TRAINER_PART).write_bytes(b"")
    with pytest.raises(CheckpointCorrupt) as e:
        checkpoint.resume_point(root / "step_000003")
    line = _one_line(e)
    assert line.startswith(f"checkpoint {root / 'step_000003'}: trainer.pt has 0 bytes")
    assert line.endswith(f"resume from it with --resume {root / 'step_000006'}")
    with pytest.raises(CheckpointCorrupt):  # load_part does not go around a failed check of its size
        checkpoint.load_part(root / "step_000003", TRAINER_PART)


def test_no_checkpoint_is_one_clear_line(tmp_path):
    cases = {tmp_path / "absent": "no such directory, so no checkpoint",
             tmp_path: f"{tmp_path} has no checkpoint to resume from",
             tmp_path / "checkpoints" / "step_000009": "no such checkpoint directory"}
    for target, message in cases.items():
        with pytest.raises(NoCheckpoint, match=message) as e:
            checkpoint.resume_point(target)
        assert isinstance(e.value, CheckpointError) and str(target) in _one_line(e)
    checkpoint.stage(tmp_path, 1)  # only an unpublished stage: still none
    with pytest.raises(NoCheckpoint, match="has no checkpoint"):
        checkpoint.resume_point(tmp_path)
    assert issubclass(CheckpointCorrupt, CheckpointError)


# ---- the trainer's state ------------------------------------------------------------------------
def _trainer(path: Path) -> tuple[torch.nn.Module, Trainer]:
    model = load_model(path, "detent", dtype=torch.bfloat16, **LIMITS)
    return model, Trainer(model, TrainSection(lr=1e-3, lr_schedule="cosine", warmup_steps=2, steps=4))


def _batch(trainer: Trainer) -> list[Sample]:
    g = torch.Generator().manual_seed(5)
    samples = []
    for i, (prompt, new, advantage) in enumerate(((9, 6, 1.0), (12, 4, -1.0), (7, 8, 0.5), (10, 5, -0.5))):
        tokens = torch.randint(0, VOCAB, (prompt + new,), generator=g).tolist()
        samples.append(Sample(f"s{i}", tokens, prompt, [], 1.0, advantage=advantage))
    for s, lp in zip(samples, trainer.rescore(samples)):
        s.rollout_logprobs = lp.tolist()
    return samples


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def test_trainer_state_streams_through_a_checkpoint_and_continues_bit_identically(tmp_path):
    path = save(hf_model("qwen2"), tmp_path / "model")
    model_a, a = _trainer(path)
    batch = _batch(a)
    a.train(batch, a.rescore(batch))
    run = tmp_path / "run"
    staged = checkpoint.stage(run, 1)
    a.save_state(staged / TRAINER_PART)
    checkpoint.save_part(staged, DRIVER_PART, {"sampler": {"position": 1}})
    checkpoint.publish(run, 1, staged)

    model_b, b = _trainer(path)
    b.load_state(checkpoint.resume_point(run) / TRAINER_PART)
    assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a.master, b.master))
    assert weights_sha256(model_b) == weights_sha256(model_a)
    for x, y in zip(a.master, b.master):
        sa, sb = a.opt.state[x], b.opt.state[y]
        assert sorted(sa) == sorted(sb) == ["exp_avg", "exp_avg_sq", "step"]
        assert all(torch.equal(_bits(sa[k]), _bits(sb[k])) for k in sa)
    assert b.opt.state_dict()["param_groups"] == a.opt.state_dict()["param_groups"]
    assert b.sched.state_dict() == a.sched.state_dict()
    gc.collect()
    maps = Path("/proc/self/maps")
    if maps.exists():  # the restored state is the trainer's own memory, not the mapped file
        assert TRAINER_PART not in maps.read_text()

    for _ in range(2):  # the uninterrupted trainer's next updates and the restored one's (the 2nd: the schedule)
        s_a, s_b = a.train(batch, a.rescore(batch)), b.train(batch, b.rescore(batch))
        assert s_a == s_b
        assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a.master, b.master))
        assert weights_sha256(model_b) == weights_sha256(model_a)


def test_a_trainer_refuses_the_state_of_another_model(tmp_path):
    _, a = _trainer(save(hf_model("qwen2"), tmp_path / "a"))
    a.save_state(tmp_path / "a.pt")
    _, b = _trainer(save(hf_model("qwen2", intermediate_size=128), tmp_path / "b"))
    with pytest.raises(ValueError, match=r"shapes differ for \['model\.layers\.0\.mlp"):
        b.load_state(tmp_path / "a.pt")
