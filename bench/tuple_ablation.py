"""A tuned tuple taken apart in the workload it was tuned for: the GRPO batch's throughput with the
model's default tuple, with the tuned tuple, and with the tuned tuple less one changed site at a time
(that site put back to its default). Where the tuner's prediction (its per-site replays, added up)
and the measured workload disagree, this says which site's choice the replays misjudged.

    python bench/tuple_ablation.py --commitment tuned.json [--model qwen2-0.5b] [--repeats 3]

The deployment limits are the tuple's own (a tuple only loads into the deployment it was tuned for).
One process, the same weights and prompts for every variant (detent_rl.bench's GRPO case, 32 prompts
x 8 samples, 200 + 256 tokens).
"""
from __future__ import annotations

import argparse

import torch

from detent_rl.bench import Bench, Shapes
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commitment", required=True)
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tuned = CommitmentTuple.load(args.commitment)
    d = tuned.deployment or {}
    limits = {k: d[k] for k in ("max_context", "max_batch", "max_num_tokens")}
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    load = lambda t: load_model(path, "detent", device="cuda", dtype=torch.bfloat16, commitment=t, **limits)  # noqa: E731
    default = load(None).selections.resolved()
    changed = [k for k in tuned.sites if default.sites.get(k) != tuned.sites[k]]
    variants = [("default", default), ("tuned", tuned)]
    variants += [(f"tuned, {k} at default", tuned.with_sites({k: default.sites[k]})) for k in changed]
    shapes = Shapes(repeats=args.repeats)
    print("| tuple | GRPO tok/s | vs default |\n|---|---|---|")
    base = None
    for name, t in variants:
        r = Bench(load(t), shapes).grpo(*shapes.grpo)
        base = base or r["tok_per_s"]
        print(f"| {name} | {r['tok_per_s']:,.0f} | {r['tok_per_s'] / base:.3f} |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
