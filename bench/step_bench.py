"""The GRPO step side by side: one recipe run in each arm, phase by phase, as ratios to the stock arm.

    python3 bench/step_bench.py RECIPE [--arms detent,stock] [--steps 6] [--warmup 2] [--checkpoint-every 0]
        [--out DIR] [key=value ...]

Each arm is a fresh `python -m detent_rl.train RECIPE run.arm=ARM ...` (the run's own driver, workers
and logs; the stock arm is the honest stock pipeline: the stock engine arm and `trainer.stock`'s
transformers trainer, with `run.on_mismatch: warn`), checkpoints off, the given overrides on top (e.g.
`rollout.prompts_per_step=32 rollout.samples_per_prompt=8`); `--checkpoint-every N` turns checkpoints on
(every N steps and the last, one kept) and adds their time (the trainer's state and the driver's,
written and published) as a phase, the median over the measured steps that saved one. From each run's
metrics.jsonl, the median over the steps after the warm-up (the first compiles kernels; decode graphs
are captured per padded batch size as each size first occurs, over the first steps) of each phase:
rollout, rewards, rescore (0 with the free bit-check), update (the free check included), weight sync,
the whole step (the checkpoint not included); the update's peak device memory; the share of tokens whose
logprobs matched the rollout's bit for bit.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PHASES = (("rollout", "rollout_time_s"), ("rewards", "reward_time_s"), ("rescore", "rescore_time_s"),
          ("update (with the free check)", "train_time_s"), ("weight sync", "weight_sync_s"), ("step", "step_time_s"))


def run_arm(recipe: str, arm: str, steps: int, out: Path, overrides: list[str], checkpoint_every: int = 0
            ) -> list[dict]:
    run_dir = out / arm
    cmd = [sys.executable, "-P", "-m", "detent_rl.train", recipe, f"run.arm={arm}", f"train.steps={steps}",
           f"run.dir={run_dir}", f"checkpoint.every={checkpoint_every}", "checkpoint.keep=1", "log.progress=false",
           *overrides]
    if arm == "stock":  # the stock arm pins nothing: a recipe's tuned tuple is the detent arm's
        cmd += ["run.on_mismatch=warn", "model.commitment=null"]
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    ap.add_argument("--arms", default="detent,stock")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the medians: the first compiles the "
                    "kernels, and decode graphs are captured per padded batch size as the sizes first occur")
    ap.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                    help="save a checkpoint every N steps (and at the last) and report its time; 0: none")
    ap.add_argument("--out", help="where the runs go (default: a temporary folder)")
    args = ap.parse_intermixed_args()
    if not 1 <= args.warmup < args.steps:
        ap.error(f"--warmup {args.warmup}: at least 1 (the first step compiles) and fewer than --steps {args.steps}")
    out = Path(args.out or tempfile.mkdtemp(prefix="step_bench_"))
    arms = args.arms.split(",")
    runs = {arm: run_arm(args.recipe, arm, args.steps, out, args.overrides, args.checkpoint_every) for arm in arms}
    phases = PHASES + ((("checkpoint (steps that saved one)", "checkpoint_time_s"),) if args.checkpoint_every else ())
    med = {arm: {key: statistics.median([m[key] for m in rows[args.warmup:] if key in m] or [0.0]) for _, key in phases}
           for arm, rows in runs.items()}
    base = "stock" if "stock" in arms else arms[0]
    print(f"\n{args.recipe} {' '.join(args.overrides)}: median s over steps {args.warmup + 1}-{args.steps}")
    print("| phase | " + " | ".join(arms) + " | " + " | ".join(f"{a} / {base}" for a in arms if a != base) + " |")
    print("|---" * (1 + len(arms) + len(arms) - 1) + "|")
    for name, key in phases:
        ratios = [f"{med[a][key] / med[base][key]:.2f}x" if med[base][key] else "—" for a in arms if a != base]
        print(f"| {name} | " + " | ".join(f"{med[a][key]:.3f}" for a in arms) + " | " + " | ".join(ratios) + " |")
    peak = {a: max(m.get("peak_memory_gib", 0.0) for m in runs[a]) for a in arms}
    if any(peak.values()):
        print("| peak device memory in the update, GiB (the process's, engine included) | "
              + " | ".join(f"{peak[a]:.1f}" for a in arms) + " | "
              + " | ".join(f"{peak[a] / peak[base]:.2f}x" if peak[base] else "—" for a in arms if a != base) + " |")
    print("| tokens bit-equal to the rollout | " + " | ".join(
        f"{100 * statistics.mean(m['bit_match'] for m in runs[a]):.1f} %" for a in arms)
        + " |" + " |" * (len(arms) - 1))


if __name__ == "__main__":
    main()
