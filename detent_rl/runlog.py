"""`RunLog` owns a run directory's logs:

- `bitcheck.jsonl`: one `bitcheck` record per step;
- `metrics.jsonl`: one line per step, ``{"step": s, **metrics}``; the report plots the keys listed in
  `detent_rl.report`;
- `samples.jsonl`: one line per sample of each step (seed, reward, advantage, completion text);
- `tb/`: the same metrics as TensorBoard scalars (optional);
- a tqdm progress bar showing reward, bit-match, KL (k3) and tokens/s (optional).

Invariants of the jsonl files:

- steps count from 1; the lines of step s are written after step s completes; within a file the
  steps strictly increase from one write to the next (samples.jsonl: a step's lines go in one write);
- each write is flushed and fsynced, so a SIGKILL loses at most the write in progress; a last line
  without its newline is such a torn write and readers drop it;
- opening a `RunLog` at `start_step` s leaves each file holding exactly its lines with step <= s (a
  run killed after its checkpoint at s may have logged later steps; 0 empties the files), so a run
  resumed from step s writes files equal to an uninterrupted run's;
- lines are deterministic: keys sorted, no spaces, floats in `repr` form (which round-trips), and
  the non-finite floats written as the strings "nan", "inf" and "-inf" (JSON has no literal for
  them; `as_float` reads them back).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, TextIO

from detent_rl import atomic

BITCHECK_FILE = "bitcheck.jsonl"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TENSORBOARD_DIR = "tb"
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class RunLog:
    """Appends a run's bit-check, metrics and sample lines (see the module docstring for the file invariants)."""

    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool, progress: bool, total_steps: int,
                 start_step: int = 0) -> None:
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, TextIO] = {}
        self._last_step: dict[str, int | None] = {}
        for name in (BITCHECK_FILE, METRICS_FILE, SAMPLES_FILE):
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

    def samples(self, step: int, records: Iterable[dict[str, Any]]) -> None:
        """Append one line ``{"step": step, **record}`` per sample of `step` to samples.jsonl, in one write."""
        self._append(SAMPLES_FILE, *({"step": step, **r} for r in records))

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        """Append ``{"step": step, **values}`` to metrics.jsonl; mirror numbers to TensorBoard and the bar."""
        if "step" in values:
            raise ValueError("metrics: 'step' is given as the argument, not as a metric key")
        clean = _jsonable(values, "metrics")
        self._append(METRICS_FILE, {"step": step, **clean})
        numbers = {k: as_float(v) for k, v in clean.items()
                   if (isinstance(v, (int, float)) and not isinstance(v, bool))
                   or (isinstance(v, str) and v in _NONFINITE)}
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

    def _append(self, name: str, *records: dict) -> None:
        steps = {r.get("step") for r in records}
        if len(steps) != 1:
            raise ValueError(f"{name}: one write holds the lines of one step, got steps {sorted(map(str, steps))}")
        (step,) = steps
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{name}: a record needs an integer 'step', got {step!r}")
        if self._last_step[name] is not None and step <= self._last_step[name]:
            raise ValueError(f"{name}: step {step} logged after step {self._last_step[name]}; "
                             f"steps must strictly increase")
        f = self._files[name]
        f.write("".join(dumps(r) + "\n" for r in records))
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
    with atomic.replacing(path) as f:
        f.writelines(line for _, line in kept)
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
