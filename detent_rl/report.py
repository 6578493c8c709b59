"""`python -m detent_rl.report runs/<name> [--out FILE]`: a run's self-contained HTML report.

Reads the run directory's `metrics.jsonl` and `bitcheck.jsonl` (written by `detent_rl.runlog.RunLog`)
and, if present, `recipe.yaml` (its `arm` key, at the top level or in any section, names the selection
arm) and `commitment.json` (the resolved commitment tuple: its sha256 and every site). Writes
`report.html` (or --out): a verdict line, a summary table, PNG plots embedded as base64 data URIs
(rendered by matplotlib's Agg canvas; no pyplot, so no global backend is set), the first-mismatches
table, and the recipe. Nothing is fetched when the file is opened.

The metrics.jsonl keys it reads, one line per step ``{"step": s, key: value, ...}``:

  reward_mean   mean reward of the step's samples
  bit_match     fraction of the step's tokens whose rollout and rescored logprobs are bit-equal
  kl_k1, kl_k3  estimates of KL(rollout policy || rescore policy) over the sampled tokens
  step_time_s   wall time of the step, seconds
  tokens_per_s  tokens (rollout + train) processed per second of the step
  rollout_ratio_mean, rollout_ratio_min, rollout_ratio_max   pi_trainer / pi_rollout per token,
                exp(logp_rescore - logp_rollout): exactly 1 when the bits match
  ratio_mean, ratio_min, ratio_max   GRPO's ratio exp(logp_new - logp_old) over the update's tokens
  clip_frac     fraction of tokens whose ratio was clipped
  loss, grad_norm, lr

bit_match, kl_k1 and kl_k3 are taken from bitcheck.jsonl when metrics.jsonl lacks them. A key not
recorded at any step gives a plot that says "not recorded". With every token bit-equal the ratio is
exactly 1 before the first update and KL is exactly 0; the stock arm, the negative control, shows
bit-match below 100 %, KL != 0 and ratio != 1.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from detent_rl import atomic
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.runlog import BITCHECK_FILE, METRICS_FILE, as_float, read_jsonl
from detent_rl.selir.errors import SelIRError

RECIPE_FILE = "recipe.yaml"
COMMITMENT_FILE = "commitment.json"  # written by detent_rl.train for the pinned arms
REPORT_FILE = "report.html"
MAX_MISMATCH_ROWS = 50


@dataclass(frozen=True)
class PlotSpec:
    """One per-step plot: `lines` are (metric key, legend label); values are multiplied by `scale`;
    `ref` draws a dashed line at the value a bit-exact run sits on; `panels` gives each line its own
    axes (k3 is often orders of magnitude below |k1| and would be a flat line beside it)."""
    title: str
    ylabel: str
    lines: tuple[tuple[str, str], ...]
    scale: float = 1.0
    ref: float | None = None
    panels: bool = False


PLOTS = (
    PlotSpec("Reward", "mean reward", (("reward_mean", "reward_mean"),)),
    PlotSpec("Bit-match", "% tokens bit-equal", (("bit_match", "bit_match"),), scale=100.0, ref=100.0),
    PlotSpec("KL(rollout || rescore)", "nats / token", (("kl_k1", "k1"), ("kl_k3", "k3")), ref=0.0, panels=True),
    PlotSpec("Step time", "seconds", (("step_time_s", "step_time_s"),)),
    PlotSpec("pi_trainer / pi_rollout", "ratio", (("rollout_ratio_min", "min"), ("rollout_ratio_mean", "mean"),
                                                  ("rollout_ratio_max", "max")), ref=1.0),
    PlotSpec("GRPO ratio", "ratio", (("ratio_min", "min"), ("ratio_mean", "mean"), ("ratio_max", "max")), ref=1.0),
    PlotSpec("Throughput", "tokens / s", (("tokens_per_s", "tokens_per_s"),)),
    PlotSpec("Clipped tokens", "fraction", (("clip_frac", "clip_frac"),)),
    PlotSpec("Loss", "loss", (("loss", "loss"),)),
    PlotSpec("Gradient norm", "norm", (("grad_norm", "grad_norm"),)),
    PlotSpec("Learning rate", "lr", (("lr", "lr"),)),
)
_FROM_BITCHECK = ("bit_match", "kl_k1", "kl_k3")
_BITCHECK_KEYS = ("tokens_compared", "tokens_equal", "max_abs_diff", "kl_k1", "kl_k3")


class ReportError(Exception):
    """A run directory that cannot be reported on; the message is one line naming the path."""


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the HTML report of `run_dir` to `out` (default run_dir/report.html); return its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"run directory not found: {run_dir}")
    metrics = _load(run_dir / METRICS_FILE)
    bitchecks = _load(run_dir / BITCHECK_FILE, _BITCHECK_KEYS)
    if not metrics and not bitchecks:
        raise ReportError(f"no logs in {run_dir}: {METRICS_FILE} and {BITCHECK_FILE} are missing or empty")
    recipe_text, arm = _recipe(run_dir / RECIPE_FILE)
    page = _render(run_dir, metrics, bitchecks, recipe_text, arm, _commitment(run_dir / COMMITMENT_FILE))
    return atomic.write_text(Path(out) if out is not None else run_dir / REPORT_FILE, page)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.report", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="the run directory, runs/<name>")
    ap.add_argument("--out", metavar="FILE", help=f"where to write the report (default RUN_DIR/{REPORT_FILE})")
    args = ap.parse_args(argv)
    try:
        path = write_report(args.run_dir, args.out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def _load(path: Path, required: tuple[str, ...] = ()) -> list[dict]:
    if not path.exists():
        return []
    try:
        records = read_jsonl(path)
    except ValueError as e:
        raise ReportError(str(e)) from None
    for number, record in enumerate(records, 1):
        lacking = [k for k in ("step", *required) if k not in record]
        if lacking or not isinstance(record["step"], int):
            raise ReportError(f"{path}:{number}: a record needs an integer 'step' and {list(required)}; "
                              f"lacking {lacking or ['an integer step']}")
    return sorted(records, key=lambda r: r["step"])


def _recipe(path: Path) -> tuple[str | None, str]:
    if not path.exists():
        return None, f"not recorded (no {RECIPE_FILE})"
    text = path.read_text(encoding="utf-8")
    try:
        arm = _find_key(yaml.safe_load(text), "arm")
    except yaml.YAMLError as e:
        return text, f"unknown ({path} does not parse: {str(e).splitlines()[0]})"
    return text, str(arm) if arm is not None else f"not recorded (no 'arm' key in {RECIPE_FILE})"


def _commitment(path: Path) -> tuple[str, str | None]:
    """(one summary line, the tuple's JSON or None) of the resolved commitment tuple the run ran with."""
    if not path.exists():
        return f"not recorded (no {COMMITMENT_FILE}; the stock arm pins nothing)", None
    try:
        tuple_ = CommitmentTuple.load(path)
    except SelIRError as e:
        raise ReportError(str(e)) from None
    return f"sha256 {tuple_.sha256()}, {len(tuple_.sites)} call sites", path.read_text(encoding="utf-8")


def _find_key(tree: Any, key: str) -> Any:
    """The value of `key` in a parsed YAML tree, breadth first (the top level wins)."""
    level = [tree]
    while level:
        dicts = [d for d in level if isinstance(d, dict)]
        for d in dicts:
            if key in d:
                return d[key]
        level = [v for d in dicts for v in d.values()]
    return None


def _series(key: str, metrics: list[dict], bitchecks: list[dict]) -> list[tuple[int, float]]:
    source, name = metrics, METRICS_FILE
    if key in _FROM_BITCHECK and not any(key in r for r in metrics):
        source, name = bitchecks, BITCHECK_FILE
    points = []
    for r in source:
        if key in r:
            try:
                points.append((r["step"], as_float(r[key])))
            except (TypeError, ValueError):
                raise ReportError(f"{name}: {key!r} at step {r['step']} is not a number: {r[key]!r}") from None
    return points


def _plot(spec: PlotSpec, lines: list[tuple[str, list[tuple[int, float]]]]) -> str:
    """A PNG of the recorded lines as a data URI; non-finite values leave gaps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [[line] for line in lines] if spec.panels else [lines]
    fig = Figure(figsize=(6.4 if len(groups) == 1 else 9.6, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    for i, group in enumerate(groups):
        ax = fig.add_subplot(1, len(groups), i + 1)
        for label, points in group:
            xs = [s for s, _ in points]
            ys = [v * spec.scale if math.isfinite(v) else math.nan for _, v in points]
            ax.plot(xs, ys, marker="o" if len(xs) <= 50 else None, markersize=3, label=label)
        if spec.ref is not None:
            ax.axhline(spec.ref, color="gray", linestyle="--", linewidth=0.8)
        ax.set_title(spec.title if len(groups) == 1 else f"{spec.title}: {group[0][0]}")
        ax.set_xlabel("step")
        ax.set_ylabel(spec.ylabel)
        ax.grid(True, alpha=0.3)
        if len(group) > 1:
            ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(spec: PlotSpec, metrics: list[dict], bitchecks: list[dict]) -> str:
    lines = [(label, _series(key, metrics, bitchecks)) for key, label in spec.lines]
    recorded = [(label, pts) for label, pts in lines if pts]
    missing = [key for (key, _), (_, pts) in zip(spec.lines, lines) if not pts]
    head = f"<h3>{html.escape(spec.title)}</h3>"
    if not recorded:
        return f'<div class="fig">{head}<p class="missing">not recorded ({", ".join(missing)})</p></div>'
    nonfinite = sum(not math.isfinite(v) for _, pts in recorded for _, v in pts)
    notes = []
    if missing:
        notes.append(f"not recorded: {', '.join(missing)}")
    if nonfinite:
        notes.append(f"{nonfinite} non-finite values left out")
    note = f'<p class="note">{html.escape("; ".join(notes))}</p>' if notes else ""
    return (f'<div class="fig">{head}<img src="{_plot(spec, recorded)}" '
            f'alt="{html.escape(spec.title)} per step">{note}</div>')


def _summary(run_dir: Path, metrics: list[dict], bitchecks: list[dict],
             arm: str) -> tuple[str, list[tuple[str, str]]]:
    """The verdict line and the summary table's rows."""
    steps = sorted({r["step"] for r in metrics + bitchecks})
    rows = [("run", str(run_dir)), ("arm", arm),
            ("steps", f"{len(steps)} ({steps[0]} to {steps[-1]})")]
    if bitchecks:
        n = sum(r["tokens_compared"] for r in bitchecks)
        n_equal = sum(r["tokens_equal"] for r in bitchecks)
        bad_steps = sum(r["tokens_equal"] != r["tokens_compared"] for r in bitchecks)
        # never print a rounded 100 % for a run with a differing token
        pct = "100 %" if n_equal == n else f"{math.floor(1e4 * 100 * n_equal / n) / 1e4} %"
        if n_equal == n:
            verdict = f"all {n} tokens bit-equal in all steps ({len(bitchecks)} steps checked)"
        else:
            verdict = (f"{n - n_equal} of {n} tokens differ (bit-match {pct}) in {bad_steps} of "
                       f"{len(bitchecks)} steps checked")
        rows += [("tokens compared", str(n)), ("overall bit-match", f"{pct} ({n - n_equal} tokens differ)"),
                 ("steps with a mismatch", f"{bad_steps} of {len(bitchecks)}"),
                 ("max |Δ|", repr(_max_abs(r["max_abs_diff"] for r in bitchecks))),
                 ("max |KL k1|, max KL k3", f"{_max_abs(r['kl_k1'] for r in bitchecks)!r}, "
                                            f"{_max_abs(r['kl_k3'] for r in bitchecks)!r}")]
    else:
        verdict = f"no bit-check records ({BITCHECK_FILE} is missing or empty)"
        rows.append(("overall bit-match", "not recorded"))
    rewards = _series("reward_mean", metrics, bitchecks)
    rows.append(("final reward", f"{rewards[-1][1]!r} (step {rewards[-1][0]})" if rewards else "not recorded"))
    lo, hi = _series("rollout_ratio_min", metrics, bitchecks), _series("rollout_ratio_max", metrics, bitchecks)
    if lo and hi:
        rows.append(("pi_trainer / pi_rollout range", f"{min(v for _, v in lo)!r} to {max(v for _, v in hi)!r}"))
    return verdict, rows


def _max_abs(values: Any) -> float:
    vals = [abs(as_float(v)) for v in values]
    return math.nan if any(math.isnan(v) for v in vals) else max(vals, default=0.0)


def _mismatch_table(bitchecks: list[dict]) -> str:
    logged = [m for r in bitchecks for m in r.get("first_mismatches", [])]
    if not logged:
        if bitchecks and all(r["tokens_equal"] == r["tokens_compared"] for r in bitchecks):
            n = sum(r["tokens_compared"] for r in bitchecks)
            return f'<p class="pass">all {n} tokens bit-equal in all steps</p>'
        if not bitchecks:
            return f"<p>no bit-check records ({BITCHECK_FILE} is missing or empty)</p>"
        return "<p>tokens differ, but no step logged its first mismatches (max_mismatches was 0)</p>"
    head = "".join(f"<th>{h}</th>" for h in ("step", "request", "position", "rollout", "rescored", "|Δ|"))
    body = []
    for m in logged[:MAX_MISMATCH_ROWS]:
        delta = abs(float.fromhex(m["rollout"]) - float.fromhex(m["rescored"]))
        cells = (m["step"], m["request_id"], m["position"], m["rollout"], m["rescored"], repr(delta))
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    shown = min(len(logged), MAX_MISMATCH_ROWS)
    return (f"<p>the first {shown} of {len(logged)} logged mismatches (each step logs its first few)</p>"
            f'<table class="mm"><tr>{head}</tr>{"".join(body)}</table>')


_CSS = """body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
.mm td{font-family:monospace}.fig{display:inline-block;vertical-align:top;margin:0 1em 1em 0}
.missing{width:640px;padding:3em 0;text-align:center;background:#f4f4f4;color:#888}
.note{color:#888;font-size:small}.pass{color:#070;font-weight:bold}.fail{color:#b00;font-weight:bold}
pre{background:#f4f4f4;padding:1em;overflow:auto}"""


def _render(run_dir: Path, metrics: list[dict], bitchecks: list[dict], recipe_text: str | None, arm: str,
            commitment: tuple[str, str | None]) -> str:
    verdict, rows = _summary(run_dir, metrics, bitchecks, arm)
    rows.insert(2, ("commitment tuple", commitment[0]))
    ok = verdict.startswith("all ")
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    figures = "\n".join(_figure(spec, metrics, bitchecks) for spec in PLOTS)
    recipe = (f"<details><summary>{RECIPE_FILE}</summary><pre>{html.escape(recipe_text)}</pre></details>"
              if recipe_text is not None else f"<p>no {RECIPE_FILE} in the run directory</p>")
    if commitment[1] is not None:
        recipe += (f"<details><summary>{COMMITMENT_FILE} (every call site's pins and knobs, defaults included)"
                   f"</summary><pre>{html.escape(commitment[1])}</pre></details>")
    title = html.escape(f"detent_rl run report: {run_dir.name}")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title><style>{_CSS}</style></head><body>
<h1>{title}</h1>
<p class="{'pass' if ok else 'fail'}">{html.escape(verdict)}</p>
<h2>Summary</h2><table>{table}</table>
<h2>Per step</h2>
{figures}
<h2>First mismatches</h2>
{_mismatch_table(bitchecks)}
<h2>Recipe and commitment tuple</h2>
{recipe}
</body></html>
"""


if __name__ == "__main__":
    sys.exit(main())
