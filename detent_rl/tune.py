"""`python -m detent_rl.tune`: a commitment tuple tuned to a workload, for the matmul call sites.

The detent arm runs every call site through pins. Which legal pin value is fastest depends on the
workload: a linear's pin is its K partition, and short chunks feed a decode step's parallel CTAs
while long ones keep a prefill's big tiles pipelined. The tuner times, on the device it runs on,
every legal K partition of every linear call site of the model at the workload's row counts (each
with a weight: how many such calls a step makes; the schedule follows M), and commits the
partition of least weighted time. The result is a new tuple: the model's resolved tuple
(`KernelSelections.resolved()`: every site it has, at the loaded tuple's values or the solver's
defaults, and the deployment) with the matmul sites replaced; the model's own selections are not
touched. Written as JSON for `model.commitment` (engine and trainer load the same file, so both
still select identically); it records the deployment it was tuned for, and a model of another
deployment (other shapes, dtype or limits) refuses it, so tune with the run's recipe (or pass the
run's limits with --model). This is the paper's tuner restricted to the matmul family; attention's
split stride and the row blocks keep their values.

    python -m detent_rl.tune --recipe recipes/grpo_bf16.yaml --out tuned.json
    python -m detent_rl.tune --model qwen2-0.5b --device cuda --rows 32:256,4096:1 --max-context 2048 --out t.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from detent_rl.kernels.commitment import CommitmentTuple, SiteCommitment
from detent_rl.kernels.matmul import launch_params, linear
from detent_rl.kernels.selections import site_key
from detent_rl.models.layers import Linear
from detent_rl.models.model import CausalLM


def _time(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (compiles a Triton variant on the GPU)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tune_matmul(model: CausalLM, rows: dict[int, float], repeats: int = 3, log=print,
                head_rows: Optional[dict[int, float]] = None) -> CommitmentTuple:
    """A new commitment tuple: the model's resolved one with each matmul site's bucket chosen by
    weighted time at `rows` (`head_rows` for the LM head, which sees only the rows whose logits are
    needed). The model and the tuple it was loaded with are left as they were."""
    sel = model.selections
    if sel.arm != "detent":
        raise ValueError(f"tuning commits pins of the detent arm; this model's arm is {sel.arm}")
    limit = sel.deployment.max_num_tokens
    bad = [m for m in [*rows, *(head_rows or {})] if not 1 <= m <= limit]
    if bad:
        raise ValueError(f"row counts {bad} are outside the deployment's 1..{limit}")
    sites: dict[str, torch.Tensor] = {}
    site_rows: dict[str, dict[int, float]] = {}
    for module in model.modules():
        if isinstance(module, Linear):
            n, k = module.weight.shape
            key = site_key("matmul", {"n": n, "k": k})
            sites.setdefault(key, module.weight)
            if module is model.lm_head and head_rows:  # its own rows (a site shared with a layer keeps both)
                site_rows[key] = {**site_rows.get(key, {}), **head_rows}
            else:
                site_rows[key] = {**rows, **site_rows.get(key, {})}
    gen = torch.Generator(device=model.device).manual_seed(0)
    tuned: dict[str, SiteCommitment] = {}
    for key, w in sorted(sites.items()):
        n, k = w.shape
        sol = sel.solution("matmul", n=n, k=k)
        by_m = {"schedule_by_m": True}  # the schedule follows M; the pin is the K partition
        chunks = sorted({sol.split(a)[0].get("chunk") for a in sol.legal if sol.split(a)[1] == by_m})
        xs = {m: torch.randn(m, k, generator=gen, device=model.device).to(w.dtype) for m in site_rows[key]}
        costs = {}
        for chunk in chunks:
            selector = sol.commit({"chunk": chunk} if chunk is not None else {}, by_m)
            costs[chunk] = sum(weight * _time(lambda m=m: linear(xs[m], w, None, **launch_params(selector(m))),
                                              model.device, repeats) for m, weight in site_rows[key].items())
        best = min(costs, key=costs.get)
        tuned[key] = SiteCommitment({"chunk": best} if best is not None else {}, by_m)
        log(f"{key}: chunk {best} (one call site's ms per step, by K chunk: "
            + ", ".join(f"{c}: {t * 1e3:.2f}" for c, t in costs.items()) + ")")
    return sel.resolved().with_sites(tuned)


def recipe_rows(recipe_path: str, overrides: list[str]
                ) -> tuple[CausalLM, dict[int, float], dict[int, float]]:
    """The recipe's model (as its workers build it), the row counts of one of its steps and those
    of its LM head."""
    from detent_rl.config import load_recipe
    from detent_rl.setup import prepare
    recipe = load_recipe(recipe_path, overrides)
    setup = prepare(recipe)
    ro, tr = recipe.rollout, recipe.train
    seqs = ro.prompts_per_step * ro.samples_per_prompt
    prompt = round(statistics.mean(len(p) for p in setup.prompts.values()))
    decode = min(ro.max_num_seqs, seqs)
    micro = min(tr.micro_batch_size, seqs) * (prompt + ro.max_new_tokens)
    micros = 2.0 * -(-seqs // tr.micro_batch_size)  # rescore + training forward per micro-batch
    rows = _weights((decode, float(ro.max_new_tokens)),  # one decode step per new token
                    (min(seqs * prompt, setup.spec.max_num_tokens), 1.0),  # the prefill (no prefix sharing)
                    (micro, micros))
    head = _weights((decode, float(ro.max_new_tokens)), (seqs, 1.0),  # decode steps; the prefill's last rows
                    (min(tr.micro_batch_size, seqs) * ro.max_new_tokens, micros))
    return setup.spec.load(), rows, head


def _weights(*pairs: tuple[int, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for m, w in pairs:  # equal row counts add up
        out[m] = out.get(m, 0.0) + w
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", help="derive the model, limits and row counts from a recipe")
    ap.add_argument("overrides", nargs="*", help="recipe overrides key.sub=value")
    ap.add_argument("--model", help="a checkpoint directory or built-in name (without --recipe)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--rows", help="M:weight,... row counts of one step and how often each occurs")
    limits = {"max_context": 4096, "max_batch": 256, "max_num_tokens": 8192}  # load_model's defaults
    for name, default in limits.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int,
                        help=f"deployment limit, as the run will have it (without --recipe; default {default})")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True, help="the commitment-tuple JSON to write")
    args = ap.parse_args(argv)
    head = None
    given = {name: getattr(args, name) for name in limits if getattr(args, name) is not None}
    if args.recipe:
        if given:
            ap.error(f"--recipe sets the deployment limits; {', '.join(given)} cannot be given with it")
        model, rows, head = recipe_rows(args.recipe, args.overrides)
    else:
        if not args.model or not args.rows:
            ap.error("give --recipe, or --model and --rows")
        from detent_rl.models import load_model
        from detent_rl.models.builtin import NAMES, builtin_checkpoint
        path = builtin_checkpoint(args.model) if args.model in NAMES else Path(args.model)
        model = load_model(path, "detent", device=args.device, dtype=getattr(torch, args.dtype),
                           **{**limits, **given})
    if args.rows:
        try:
            rows = {int(m): float(w) for m, w in (item.split(":") for item in args.rows.split(","))}
        except ValueError:
            ap.error(f"--rows {args.rows!r}: expected M:weight,... e.g. 16:32,512:1")
    if model.device.type == "cpu":
        torch.set_num_threads(1)
    print(f"tuning matmul sites at rows {rows} (LM head: {head or rows}) on {model.device}")
    tuple_ = tune_matmul(model, rows, args.repeats, head_rows=head)
    tuple_.save(args.out)
    print(f"wrote {args.out} ({len(tuple_.sites)} sites, sha256 {tuple_.sha256()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
