"""One PNG of runs side by side: mean reward (raw and a moving average) and % tokens bit-equal per step.

    python bench/plot_runs.py OUT.png RUN_DIR[=LABEL] ... [--window 10] [--title TEXT]

Reads each run's metrics.jsonl and bitcheck.jsonl (the report's own loaders), so a run cut short
(a time box) plots the steps it logged.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from detent_rl.report import BITCHECK_FILE, METRICS_FILE, _load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR[=LABEL]")
    ap.add_argument("--window", type=int, default=10, help="moving-average window over steps")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.4), dpi=100)
    FigureCanvasAgg(fig)
    reward, bits = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for spec in args.runs:
        path, _, label = spec.partition("=")
        label = label or Path(path).name
        metrics = _load(Path(path) / METRICS_FILE)
        checks = _load(Path(path) / BITCHECK_FILE)
        steps = [m["step"] for m in metrics]
        values = [m["reward_mean"] for m in metrics]
        line, = reward.plot(steps, values, alpha=0.35, linewidth=0.8)
        spans = (values[max(0, i - args.window + 1):i + 1] for i in range(len(values)))
        avg = [sum(span) / len(span) for span in spans]
        reward.plot(steps, avg, color=line.get_color(), label=f"{label} ({args.window}-step mean)")
        bits.plot([c["step"] for c in checks], [100 * c["bit_match"] for c in checks], color=line.get_color(),
                  marker="o" if len(checks) <= 30 else None, markersize=3, label=label)
    reward.set(title=f"{args.title} mean reward".strip(), xlabel="step", ylabel="mean reward")
    bits.set(title="tokens bit-equal, rollout vs trainer", xlabel="step", ylabel="%", ylim=(-5, 105))
    for ax in (reward, bits):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, format="png", metadata={"Software": None})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
