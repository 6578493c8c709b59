"""Bit-check records (bits, not ==; KL; hashes; first mismatches), the raise/warn policy, and RunLog's
files: deterministic lines, fsync'd appends, resume truncation equal to an uninterrupted run."""
from __future__ import annotations

import hashlib
import json
import math
import struct

import pytest
import torch

from detent_rl import bitcheck as B, runlog as L


def _logprobs(seed: int, lengths: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [-torch.rand(n, generator=g, dtype=torch.float32) * 5 for n in lengths]


def _copy(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in ts]


def test_equal_tensors_match_bit_for_bit_with_zero_kl():
    a = _logprobs(0, [7, 0, 12])
    r = B.bitcheck(4, ["r0", "r1", "r2"], a, _copy(a))
    assert r["step"] == 4 and r["sequences"] == 3 and r["sequences_equal"] == 3
    assert r["tokens_compared"] == r["tokens_equal"] == 19
    assert r["bit_match"] == 1.0 and r["first_mismatches"] == []
    assert r["kl_k1"] == 0.0 and r["kl_k3"] == 0.0 and r["max_abs_diff"] == 0.0
    assert r["sha256_rollout"] == r["sha256_rescored"]
    little_endian = b"".join(struct.pack("<f", x) for t in a for x in t.tolist())
    assert r["sha256_rollout"] == hashlib.sha256(little_endian).hexdigest()
    B.enforce(r, "raise")  # nothing to report


def test_perturbed_tensors_report_first_mismatch_in_hex():
    a = _logprobs(1, [5, 6, 4])
    b = _copy(a)
    b[1][3] = torch.nextafter(b[1][3], torch.tensor(0.0))  # one ulp towards zero
    b[1][5] = b[1][5] - 0.25
    b[2][0] = b[2][0] + 0.5
    r = B.bitcheck(9, ["a", "b", "c"], a, b)
    assert (r["tokens_compared"], r["tokens_equal"], r["sequences_equal"]) == (15, 12, 1)
    assert r["bit_match"] == 12 / 15
    assert [(m["request_id"], m["position"]) for m in r["first_mismatches"]] == [("b", 3), ("b", 5), ("c", 0)]
    first = r["first_mismatches"][0]
    assert first["step"] == 9
    assert first["rollout"] == float(a[1][3]).hex() and first["rescored"] == float(b[1][3]).hex()
    assert float.fromhex(first["rollout"]) == float(a[1][3])
    assert first["rollout_bits"] == f"0x{struct.unpack('<I', struct.pack('<f', float(a[1][3])))[0]:08x}"
    assert r["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    d = torch.cat(a).double() - torch.cat(b).double()
    assert r["kl_k1"] == pytest.approx(float(d.mean())) and r["kl_k1"] != 0.0
    assert r["kl_k3"] == pytest.approx(float((torch.exp(-d) - 1 + d).mean())) and r["kl_k3"] > 0.0
    assert r["sha256_rollout"] != r["sha256_rescored"]
    assert len(B.bitcheck(9, ["a", "b", "c"], a, b, max_mismatches=2)["first_mismatches"]) == 2


def test_negative_zero_differs_by_bits_and_nan_payloads_compare_by_bits():
    r = B.bitcheck(1, ["z"], [torch.tensor([0.0, 1.0])], [torch.tensor([-0.0, 1.0])])
    assert r["tokens_equal"] == 1 and r["first_mismatches"][0]["rescored"] == "-0x0.0p+0"
    assert r["kl_k1"] == 0.0 and r["max_abs_diff"] == 0.0  # equal as numbers, yet not the same bits
    nan_a = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
    assert B.bitcheck(1, ["n"], [nan_a], [nan_a.clone()])["tokens_equal"] == 1
    r = B.bitcheck(1, ["n"], [nan_a], [nan_b])
    assert r["tokens_equal"] == 0
    assert (r["first_mismatches"][0]["rollout_bits"], r["first_mismatches"][0]["rescored_bits"]) == \
        ("0x7fc00001", "0x7fc00002")


def test_bad_inputs_name_the_request():
    with pytest.raises(ValueError, match=r"request 'r1'.*3 rollout logprobs but 4 rescored"):
        B.bitcheck(2, ["r0", "r1"], [torch.zeros(2), torch.zeros(3)], [torch.zeros(2), torch.zeros(4)])
    with pytest.raises(ValueError, match=r"request 'r0'.*float32"):
        B.bitcheck(2, ["r0"], [torch.zeros(2, dtype=torch.bfloat16)], [torch.zeros(2, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="one per request"):
        B.bitcheck(2, ["r0", "r1"], [torch.zeros(2)], [torch.zeros(2)])


def test_enforce_raise_names_the_first_mismatch_and_warn_warns_the_same():
    a = _logprobs(2, [4, 4])
    b = _copy(a)
    b[1][2] += 1.0
    r = B.bitcheck(17, ["req-a", "req-b"], a, b)
    with pytest.raises(B.MismatchError) as info:
        B.enforce(r, "raise")
    text = str(info.value)
    for part in ("step 17", "'req-b'", "position 2", float(a[1][2]).hex(), float(b[1][2]).hex(), "1 of 8"):
        assert part in text
    assert info.value.record is r
    with pytest.warns(B.MismatchWarning) as caught:
        B.enforce(r, "warn")
    assert str(caught[0].message) == text
    with pytest.raises(ValueError, match="policy"):
        B.enforce(r, "ignore")


def _write_run(run_dir, steps, start_step=0):
    with L.RunLog(run_dir, tensorboard=False, progress=False, total_steps=5, start_step=start_step) as log:
        for s in steps:
            a = _logprobs(s, [3, 2])
            log.bitcheck(B.bitcheck(s, ["x", "y"], a, _copy(a)))
            log.metrics(s, {"reward_mean": 0.1 * s, "kl_k1": 0.0, "bad": math.nan, "big": -math.inf})


def test_runlog_writes_deterministic_lines(tmp_path):
    _write_run(tmp_path / "run", [1, 2])
    lines = (tmp_path / "run" / L.METRICS_FILE).read_text().splitlines()
    assert lines[0] == '{"bad":"nan","big":"-inf","kl_k1":0.0,"reward_mean":0.1,"step":1}'
    records = L.read_jsonl(tmp_path / "run" / L.BITCHECK_FILE)
    assert [r["step"] for r in records] == [1, 2] and records[0]["bit_match"] == 1.0
    assert math.isnan(L.as_float(json.loads(lines[1])["bad"]))
    with L.RunLog(tmp_path / "run", tensorboard=False, progress=False, total_steps=5, start_step=2) as log:
        with pytest.raises(ValueError, match="strictly increase"):
            log.metrics(2, {"reward_mean": 1.0})


def test_resume_truncates_to_the_checkpoint_and_matches_an_uninterrupted_run(tmp_path):
    _write_run(tmp_path / "fresh", [1, 2, 3, 4])
    _write_run(tmp_path / "killed", [1, 2, 3, 4, 5])
    with open(tmp_path / "killed" / L.METRICS_FILE, "a") as f:
        f.write('{"reward_mean":0.6,"st')  # torn line of a SIGKILL
    with L.RunLog(tmp_path / "killed", tensorboard=False, progress=False, total_steps=5, start_step=3):
        pass
    for name in (L.BITCHECK_FILE, L.METRICS_FILE):
        assert [r["step"] for r in L.read_jsonl(tmp_path / "killed" / name)] == [1, 2, 3]
    _write_run(tmp_path / "killed", [4], start_step=3)
    for name in (L.BITCHECK_FILE, L.METRICS_FILE):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()
    _write_run(tmp_path / "killed", [1], start_step=0)  # a fresh start empties the logs
    assert [r["step"] for r in L.read_jsonl(tmp_path / "killed" / L.METRICS_FILE)] == [1]


def test_runlog_tensorboard_and_progress(tmp_path, capsys):
    with L.RunLog(tmp_path, tensorboard=True, progress=True, total_steps=2) as log:
        log.metrics(1, {"reward_mean": 0.5, "bit_match": 1.0, "kl_k3": 0.0, "tokens_per_s": 1234.0, "note": "x"})
    assert list((tmp_path / L.TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    err = capsys.readouterr().err
    assert "reward=0.5" in err and "bits=100.00%" in err and "tok/s=1234" in err


def test_samples_are_one_write_per_step_truncated_on_resume_like_the_other_logs(tmp_path):
    def samples(step: int) -> list[dict]:
        return [{"request_id": f"{step}#{j}", "reward": float(j)} for j in range(3)]

    with L.RunLog(tmp_path, tensorboard=False, progress=False, total_steps=3) as log:
        for step in (1, 2, 3):
            log.samples(step, samples(step))
        with pytest.raises(ValueError, match="step 2 logged after step 3"):
            log.samples(2, samples(2))
    rows = L.read_jsonl(tmp_path / L.SAMPLES_FILE)
    assert [(r["step"], r["request_id"]) for r in rows] == [(s, f"{s}#{j}") for s in (1, 2, 3) for j in range(3)]
    with L.RunLog(tmp_path, tensorboard=False, progress=False, total_steps=3, start_step=1) as log:
        log.samples(2, samples(2))  # a run resumed from step 1 writes step 2 again, once
    assert [r["step"] for r in L.read_jsonl(tmp_path / L.SAMPLES_FILE)] == [1, 1, 1, 2, 2, 2]
