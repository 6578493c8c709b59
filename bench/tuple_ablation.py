"""A tuned tuple taken apart in the workload it was tuned for: the GRPO batch's throughput with the
model's default tuple, with the tuned tuple, and with the tuned tuple less one changed site at a time
(that site put back to its default). Where the tuner's prediction (its per-site replays, added up)
and the measured workload disagree, this says which site's choice the replays misjudged.

    python bench/tuple_ablation.py --commitment tuned.json [--model qwen2-0.5b] [--repeats 3]
    python bench/tuple_ablation.py --commitment tuned.json --workload tune --prompts 32 --samples 8 \
        --prompt-len 200 --new-tokens 256 --micro-batch 8 --max-num-seqs 256

`--workload tune` runs the tuner's own workload instead (`detent_rl.workload.Workload`: generate, then
rescore in micro-batches — what `python -m detent_rl.tune` predicts and checks), every variant's
engine alive at once and the variants run in turn, `--repeats` rounds, medians by phase: where the
tuner's check and its per-site gains disagree, which site's choice and which phase it is.

The deployment limits are the tuple's own (a tuple only loads into the deployment it was tuned for).
One process, the same weights and prompts for every variant (detent_rl.bench's GRPO case, 32 prompts
x 8 samples, 200 + 256 tokens).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from detent_rl.bench_cases import Bench, Shapes
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.workload import Workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commitment", required=True)
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workload", choices=("grpo", "tune"), default="grpo",
                    help="grpo: the bench's GRPO batch (generation); tune: the tuner's workload, by phase")
    for name, default in (("prompts", 32), ("samples", 8), ("prompt-len", 200), ("new-tokens", 256),
                          ("micro-batch", 8), ("max-num-seqs", 256)):
        ap.add_argument(f"--{name}", type=int, default=default, help="--workload tune: the workload's shape")
    args = ap.parse_args()
    tuned = CommitmentTuple.load(args.commitment)
    d = tuned.deployment or {}
    limits = {k: d[k] for k in ("max_context", "max_batch", "max_num_tokens")}
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    load = lambda t: load_model(path, "detent", device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                commitment=t, **limits)
    default = load(None).selections.resolved()
    changed = [k for k in tuned.sites if default.sites.get(k) != tuned.sites[k]]
    variants = [("default", default), ("tuned", tuned)]
    variants += [(f"tuned, {k} at default", tuned.with_sites({k: default.sites[k]})) for k in changed]
    if args.workload == "tune":
        workload = Workload(prompts=args.prompts, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                            micro_batch=args.micro_batch, max_num_seqs=args.max_num_seqs, samples=args.samples)
        by_phase(workload, [(name, load(t)) for name, t in variants], args.repeats)
        return
    shapes = Shapes(repeats=args.repeats)
    print("| tuple | GRPO tok/s | vs default |\n|---|---|---|")
    base = None
    for name, t in variants:
        r = Bench(load(t), shapes).grpo(*shapes.grpo)
        base = base or r["tok_per_s"]
        print(f"| {name} | {r['tok_per_s']:,.0f} | {r['tok_per_s'] / base:.3f} |", flush=True)
        torch.cuda.empty_cache()


def by_phase(workload: Workload, variants: list, repeats: int) -> None:
    """Every variant's engine warmed up, then the workload on each in turn, `repeats` rounds (the order
    rotated by one each round), and the medians of generate and rescore, and the total against the first variant's."""
    engines = [(name, workload.engine(model)) for name, model in variants]
    for _, engine in engines:
        workload.run(engine)  # compiles kernels, captures graphs
    times = {name: [] for name, _ in engines}
    for r in range(repeats):  # each round starts one variant later: no variant always runs first
        for name, engine in engines[r % len(engines):] + engines[:r % len(engines)]:
            times[name].append(workload.run_phases(engine))
    med = {name: tuple(statistics.median(t[i] for t in runs) for i in range(2)) for name, runs in times.items()}
    base = sum(med[engines[0][0]])
    print(f"medians of {repeats} rounds, s\n| tuple | generate | rescore | total | total vs {engines[0][0]} |\n"
          "|---|---|---|---|---|")
    for name, (gen, rescore) in med.items():
        print(f"| {name} | {gen:.3f} | {rescore:.3f} | {gen + rescore:.3f} | {(gen + rescore) / base:.3f} |")


if __name__ == "__main__":
    main()
