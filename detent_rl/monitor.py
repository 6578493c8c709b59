"""Per-step bit-checks of rollout vs rescored logprobs, and the run's logs (jsonl, TensorBoard, progress).

`bitcheck` compares, token by token, the logprob the rollout engine recorded when it sampled a token
with the logprob the trainer's rescore computes for it. Equality is of BITS (each fp32 viewed as an
int32), so -0.0 and 0.0 differ and a NaN equals only a NaN with the same payload. `enforce` turns a
record with any differing token into a `MismatchError` (policy "raise") or a `MismatchWarning`
(policy "warn"), naming the first mismatch.

`RunLog` owns a run directory's logs:

- `bitcheck.jsonl`: one `bitcheck` record per step;
- `metrics.jsonl`: one line per step, ``{"step": s, **metrics}``; the report plots the keys listed in
  `detent_rl.report`;
- `tb/`: the same metrics as TensorBoard scalars (optional);
- a tqdm progress bar showing reward, bit-match, KL (k3) and tokens/s (optional).

Invariants of the jsonl files:

- steps count from 1; the line for step s is written after step s completes; within a file the
  steps strictly increase;
- each line is written by one `write` then flushed and fsynced, so a SIGKILL loses at most the line
  being written; a last line without its newline is such a torn write and readers drop it;
- opening a `RunLog` at `start_step` s leaves each file holding exactly its lines with step <= s (a
  run killed after its checkpoint at s may have logged later steps; 0 empties the files), so a run
  resumed from step s writes files equal to an uninterrupted run's;
- lines are deterministic: keys sorted, no spaces, floats in `repr` form (which round-trips), and
  the non-finite floats written as the strings "nan", "inf" and "-inf" (JSON has no literal for
  them; `as_float` reads them back).
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Literal, Sequence, TextIO

import torch

BITCHECK_FILE = "bitcheck.jsonl"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tb"
POLICIES = ("raise", "warn")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class MismatchError(RuntimeError):
    """A bit-check found rollout and rescored logprobs that differ; `.record` is the bit-check record."""

    def __init__(self, message: str, record: dict) -> None:
        super().__init__(message)
        self.record = record


class MismatchWarning(UserWarning):
    """Category of the warning `enforce` emits under policy "warn"."""


def bitcheck(step: int, request_ids: Sequence[str], rollout: Sequence[torch.Tensor],
             rescored: Sequence[torch.Tensor], max_mismatches: int = 16) -> dict:
    """Compare each request's rollout logprobs with its rescored logprobs, bit for bit.

    Each request contributes two 1-D fp32 tensors of equal length (one logprob per sampled token).
    The record holds: step; sequences and sequences_equal (requests whose tokens are all
    bit-equal); tokens_compared, tokens_equal and bit_match = tokens_equal / tokens_compared (1.0
    when no token is compared); first_mismatches, up to `max_mismatches` of
    {step, request_id, position, rollout, rescored, rollout_bits, rescored_bits} in request order then
    position, with values as `float.hex` and bits as "0x%08x" (the hex of a NaN hides its payload);
    max_abs_diff = max |rollout - rescored|; kl_k1 and kl_k3; sha256_rollout and sha256_rescored over
    the requests' little-endian fp32 bytes concatenated in request order.

    KL direction: the tokens were sampled from the rollout policy p and q is the rescore policy, so
    with r = log q(x) - log p(x), k1 = mean(-r) and k3 = mean(exp(r) - 1 - r) both estimate
    KL(p || q) (Schulman's k1 and k3), the mean taken over all tokens of the step, in float64. Both
    are exactly 0.0 when every token is bit-equal; k1 may be negative, k3 never is.
    """
    if not (len(request_ids) == len(rollout) == len(rescored)):
        raise ValueError(f"bitcheck at step {step}: {len(request_ids)} request ids, {len(rollout)} rollout "
                         f"tensors and {len(rescored)} rescored tensors; they must be one per request")
    if max_mismatches < 0:
        raise ValueError(f"max_mismatches must be >= 0, got {max_mismatches}")
    for rid, a, b in zip(request_ids, rollout, rescored):
        for side, t in (("rollout", a), ("rescored", b)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 1:
                what = (f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                        else type(t).__name__)
                raise ValueError(f"bitcheck at step {step}, request {rid!r}: {side} logprobs must be a 1-D "
                                 f"float32 tensor, got a {what}")
        if a.numel() != b.numel():
            raise ValueError(f"bitcheck at step {step}, request {rid!r}: {a.numel()} rollout logprobs but "
                             f"{b.numel()} rescored logprobs")
    lengths = [t.numel() for t in rollout]
    a = _concat(rollout)
    b = _concat(rescored)
    equal = a.view(torch.int32) == b.view(torch.int32)
    n = a.numel()
    n_equal = int(equal.sum())
    sequences_equal = sum(bool(chunk.all()) for chunk in torch.split(equal, lengths)) if lengths else 0
    first: list[dict] = []
    if n_equal < n and max_mismatches > 0:
        starts = list(itertools.accumulate(lengths, initial=0))[:-1]
        for idx in (~equal).nonzero().flatten()[:max_mismatches].tolist():
            req = bisect.bisect_right(starts, idx) - 1  # the last request starting at or before idx
            first.append({"step": step, "request_id": request_ids[req], "position": idx - starts[req],
                          "rollout": float(a[idx]).hex(), "rescored": float(b[idx]).hex(),
                          "rollout_bits": _bits(a[idx]), "rescored_bits": _bits(b[idx])})
    d = a.double() - b.double()  # log p - log q
    if n:
        kl_k1 = float(d.mean())
        kl_k3 = float((torch.expm1(-d) + d).mean())  # exp(r) - 1 - r with r = -d, expm1 for small r
        max_abs_diff = float(d.abs().max())
    else:
        kl_k1 = kl_k3 = max_abs_diff = 0.0
    return {"step": step, "sequences": len(lengths), "sequences_equal": sequences_equal,
            "tokens_compared": n, "tokens_equal": n_equal, "bit_match": n_equal / n if n else 1.0,
            "first_mismatches": first, "max_abs_diff": max_abs_diff, "kl_k1": kl_k1, "kl_k3": kl_k3,
            "sha256_rollout": _sha256(a), "sha256_rescored": _sha256(b)}


def enforce(record: dict, policy: Literal["raise", "warn"]) -> None:
    """Act on a bit-check record: nothing if every token is bit-equal, else raise or warn per `policy`.

    The message names the step, how many tokens differ, and the first mismatch's request id,
    position and both values in hex.
    """
    if policy not in POLICIES:
        raise ValueError(f"on_mismatch policy must be one of {POLICIES}, got {policy!r}")
    if record["tokens_equal"] == record["tokens_compared"]:
        return
    message = mismatch_message(record)
    if policy == "raise":
        raise MismatchError(message, record)
    warnings.warn(message, MismatchWarning, stacklevel=2)


def mismatch_message(record: dict) -> str:
    """One line describing a failed bit-check: counts, the first mismatch, max |Δ| and KL."""
    n, n_equal = record["tokens_compared"], record["tokens_equal"]
    text = (f"bit-check failed at step {record['step']}: {n - n_equal} of {n} tokens differ between rollout "
            f"and rescored logprobs")
    if record["first_mismatches"]:
        m = record["first_mismatches"][0]
        text += (f"; first mismatch: request {m['request_id']!r} position {m['position']}: rollout "
                 f"{m['rollout']} vs rescored {m['rescored']}")
    return text + (f"; max |Δ| {record['max_abs_diff']!r}, KL k1 {record['kl_k1']!r}, "
                   f"k3 {record['kl_k3']!r}")


class RunLog:
    """Appends a run's bit-check and metrics lines (see the module docstring for the file invariants)."""

    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool, progress: bool, total_steps: int,
                 start_step: int = 0) -> None:
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, TextIO] = {}
        self._last_step: dict[str, int | None] = {}
        for name in (BITCHECK_FILE, METRICS_FILE):
            path = self.run_dir / name
            self._last_step[name] = truncate_jsonl(path, start_step)
            self._files[name] = open(path, "a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step hides events an earlier (killed) run logged past start_step, as truncation does
            self._writer = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR), purge_step=start_step + 1)
        self._bar = None
        if progress:
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def bitcheck(self, record: dict) -> None:
        """Append one `bitcheck` record to bitcheck.jsonl."""
        self._append(BITCHECK_FILE, record)

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        """Append ``{"step": step, **values}`` to metrics.jsonl; mirror numbers to TensorBoard and the bar."""
        if "step" in values:
            raise ValueError("metrics: 'step' is given as the argument, not as a metric key")
        clean = _jsonable(values, "metrics")
        self._append(METRICS_FILE, {"step": step, **clean})
        numbers = {k: as_float(v) for k, v in clean.items()
                   if (isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, str) and v in _NONFINITE)}
        if self._writer is not None:
            for key, value in sorted(numbers.items()):
                self._writer.add_scalar(key, value, step)
        if self._bar is not None:
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            shown = {"reward": ("reward_mean", "{:.4g}"), "bits": ("bit_match", "{:.2%}"),
                     "kl": ("kl_k3", "{:.3g}"), "tok/s": ("tokens_per_s", "{:.0f}")}
            self._bar.set_postfix({label: fmt.format(numbers[key]) for label, (key, fmt) in shown.items()
                                   if key in numbers}, refresh=True)

    def close(self) -> None:
        """Close the files, the TensorBoard writer and the bar; safe to call twice."""
        for f in self._files.values():
            f.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, name: str, record: dict) -> None:
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{name}: a record needs an integer 'step', got {step!r}")
        if self._last_step[name] is not None and step <= self._last_step[name]:
            raise ValueError(f"{name}: step {step} logged after step {self._last_step[name]}; "
                             f"steps must strictly increase")
        f = self._files[name]
        f.write(dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
        self._last_step[name] = step


def dumps(record: dict) -> str:
    """The deterministic one-line JSON form of a record (sorted keys; non-finite floats as strings)."""
    return json.dumps(_jsonable(record, "record"), sort_keys=True, separators=(",", ":"), allow_nan=False)


def as_float(value: Any) -> float:
    """A logged number back as a float: "nan"/"inf"/"-inf" strings and None (as NaN) included."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        if value not in _NONFINITE:
            raise ValueError(f"not a logged number: {value!r}")
        return _NONFINITE[value]
    return float(value)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """A jsonl log's records; a torn last line (no newline) is dropped, any other bad line is an error."""
    return _read(Path(path))[0]


def truncate_jsonl(path: str | os.PathLike, keep_through_step: int) -> int | None:
    """Rewrite `path` (atomically) to its lines with step <= `keep_through_step`; return the last kept step.

    A missing file is created empty. The kept lines are copied byte for byte.
    """
    path = Path(path)
    if not path.exists():
        path.touch()
        return None
    records, lines = _read(path)
    kept = [(r["step"], line) for r, line in zip(records, lines) if r.get("step", math.inf) <= keep_through_step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line for _, line in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return max(step for step, _ in kept) if kept else None


def _read(path: Path) -> tuple[list[dict], list[str]]:
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if lines and not lines[-1].endswith("\n"):
        lines.pop()  # torn write of a killed run
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON line ({e.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records, lines


def _jsonable(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # torch / numpy scalars
        return _jsonable(value.item(), where)
    raise TypeError(f"{where}: cannot log a value of type {type(value).__name__}")


def _concat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=torch.float32)
    return torch.cat([t.detach().reshape(-1) for t in tensors]).cpu().contiguous()


def _bits(x: torch.Tensor) -> str:
    return f"0x{int(x.view(torch.int32)) & 0xFFFFFFFF:08x}"


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().astype("<f4", copy=False).tobytes()).hexdigest()
