"""`python -m detent_rl.tune`: a commitment tuple tuned to a workload, family by family (the paper's §6).

1. Profile. Run the workload once with the model's own tuple (the default where it loaded none) and
   record, per call site, its distinct selector calls (the batch-dependent values each launch passed)
   with how often each occurred.
2. Search, one site at a time. A site's grid is its legal assignments (pins and the knobs only its
   selection reads). Each candidate is a repin — the selector recompiled with other constants, no
   re-solve — whose cost is its recorded calls replayed on synthetic inputs of their shapes, each
   timed and weighted by its count (a gated MLP's gate/up site, with `DETENT_GATED_MLP=1`, as the MLP
   runs it: SiLU-and-mul in the epilogue where the schedule allows). Sites are searched separately,
   because their costs add up: the search is a sum of grid sizes, not their product
   (`detent_rl/tune_search.py`). The grid is first cut to one candidate per distinct launch over the
   recorded calls (`candidates`:
   attention's 115,050 legal assignments at a 12k context are 157 launches). At most `EXHAUSTIVE`
   candidates are measured whole; more by coordinate descent from the default (each axis swept with
   the others fixed, an axis of many values bracketed in LADDER-sample rounds, repeated while it
   improves) within `BUDGET` of the legal grid. A best other than the default is then re-timed beside
   it, `repeats` rounds, and kept only for a saving of at least `MIN_GAIN` (`confirm`: the search's
   minimum over many single timings flatters its winner). The attention search on 2 x 12,000-token prompts,
   which swept the split axis value by value (with its count held fixed, so never below the
   default's split), did not finish in 240 s on the H200 before this.
3. Check. The tuned tuple's engine is built while the profiled one is still alive, and the workload
   runs on the two alternately, `repeats` rounds (default first, then tuned first, ...), neither
   recording its selector calls; the medians are T(default) and T(tuned). With T(a) = C + Σ_f T_f(a_f)
   the prediction is T(default) - Σ_f (T_f(default_f) - T_f(tuned_f)), the per-site gains; both times
   come from the same conditions (two engines alive, the same rounds), so the additivity error, the
   measured saving's distance from the predicted one over T(tuned), is the families' interaction and
   not the setup. The profiled run (recording on, one engine alive, timed once) is still reported but
   not predicted from: against one later run of the tuned engine it put a 22 % "error" on the H200 on
   a tuple that was faster than the default. Each round's pair gives a saving of its own, and the
   report says how the rounds' savings spread, by phase too (generate; rescore, whose eager forwards
   are host-bound and spread most): where the spread holds both no saving and the predicted one, the
   check cannot tell them apart (session 28 on the H200: five rounds measured a 40 ms-faster tuple
   236 ms slower, its rescoring spreading 0.84-1.43 s a round).

Families measured: matmul (its pin is the K partition; its knobs the schedule per M bucket; its
replays rotate the weights through copies, `timing.cold_copies`, so they come from HBM as in a step
and not from the L2 cache, which held the smaller sites' weights and misled the first GPU search),
rmsnorm and log-softmax (row blocks), and
attention (split size and stride; a recorded call is replayed as a step of its shape over random
keys already in the cache). A site with more than MAX_CALLS distinct calls (decode: one per KV
length) is replayed through MAX_CALLS of them, evenly spaced, each weighted by the calls it stands
for. The sampler and the elementwise ops have nothing to choose. The tuple written is the model's
resolved one (every site it has, defaults included, and the deployment) with the tuned sites
replaced; the model itself is not changed. Engine and trainer load
the same file (`model.commitment`), so both still select identically; a model of another deployment
refuses it, so tune with the run's recipe (or pass the run's limits with --model).

    python -m detent_rl.tune --recipe recipes/grpo_bf16.yaml --out tuned.json
    python -m detent_rl.tune --model qwen2-0.5b --device cuda --prompts 32 --samples 8 --max-num-seqs 256 \
        --prompt-len 200 --new-tokens 256 --out t.json

`--serve` tunes for online serving instead of an RL step: the bench's Poisson trace (64 requests, prompts of 64-512
tokens, 32-256 new), arriving `--arrivals-per-step` requests a step while the engine steps (`ServingWorkload`), the
calls an online serve makes (prefill chunks beside decode rows, decode at the batch sizes the arrivals leave):

    python -m detent_rl.tune --model qwen2-1.5b --device cuda --serve --max-context 784 --out serve.json

`--families matmul` searches one family (the others keep the tuple's values: the model's own, or with
`--commitment FILE` a tuple tuned before, e.g. to re-tune one family after its kernel changed). A workload
the deployment cannot run (`Workload.check`) is refused before anything runs.

    python -m detent_rl.tune --model qwen2-0.5b ... --commitment old.json --families attention --out new.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from typing import Any, Callable, Optional

import torch

from detent_rl.kernels.attention import attn_meta, paged_attention
from detent_rl.kernels.commitment import CommitmentError, CommitmentTuple, SiteCommitment
from detent_rl.kernels.log_softmax import token_logprobs
from detent_rl.kernels import matmul_gated
from detent_rl.kernels.matmul import launch_params, linear
from detent_rl.kernels.matmul_gated import gate_up_silu
from detent_rl.kernels.rmsnorm import rmsnorm
from detent_rl.models.layers import MLP
from detent_rl.models.model import CausalLM
from detent_rl.rollout.engine import Engine
from detent_rl.timing import cold_copies, kernel_timer
from detent_rl.tune_report import SiteReport, TuneReport
from detent_rl.tune_search import budget_for, candidates, confirm, search
from detent_rl.workload import ServingWorkload, Workload, recipe_workload  # noqa: F401 (re-exports)

MAX_CALLS = 12  # distinct calls replayed per candidate; more are thinned to this many, weights kept
TUNED = ("matmul", "rmsnorm", "log_softmax", "attention")


def profile(engine: Engine, workload: Workload | ServingWorkload) -> tuple[float, dict[str, Counter]]:
    """(seconds, per site key the Counter of its selector calls' arguments) of one workload run."""
    with engine.model.selections.recording() as calls:
        seconds = workload.run(engine)
    return seconds, {key: c for key, c in calls.items() if c}


def _launcher(model: CausalLM, family: str, site: dict, args: tuple, gen: torch.Generator
              ) -> Callable[[Any], Callable[[], Any]]:
    """For one recorded call: synthetic inputs of its shapes, and selection -> the kernel launch thunk."""
    dev, dtype, rows = model.device, model.dtype, args[0]
    rand = lambda *shape: torch.randn(*shape, generator=gen, device=dev).to(dtype)  # noqa: E731
    if family == "matmul":  # the weights rotate through copies: a step reads them from HBM, not L2
        x, w = rand(rows, site["k"]), cold_copies(rand(site["n"], site["k"]))
        gated = _gated_mlp(model, site)
        if gated is not None:  # what the MLP runs at this schedule: one launch where `fusable`, else two
            block = gated(rows).block
            return lambda s: (lambda: gate_up_silu(x, w(), None, block=block, **launch_params(s)))
        return lambda s: (lambda: linear(x, w(), None, **launch_params(s)))
    if family == "rmsnorm":
        x = rand(rows, site.get("hidden", model.config.hidden_size))
        res, w = torch.randn_like(x), rand(x.shape[1])
        return lambda s: (lambda: rmsnorm(x, w, 1e-6, block=s.block, num_warps=s.num_warps, residual=res))
    if family == "log_softmax":
        logits = rand(rows, model.config.vocab_size)
        ids = torch.randint(0, model.config.vocab_size, (rows,), generator=gen, device=dev)
        return lambda s: (lambda: token_logprobs(logits, ids, block=s.block, num_warps=s.num_warps))
    if family == "attention":
        return _attention_launcher(model, args, rand)
    raise ValueError(f"the tuner does not measure family {family!r}")


def _gated_mlp(model: CausalLM, site: dict) -> Optional[Callable]:
    """Where `site` is a gated MLP's gate/up projection whose SiLU-and-mul the pinned arms run in its epilogue
    (`DETENT_GATED_MLP=1`, `kernels/matmul_gated.py`): that MLP's SiLU-and-mul selector, so that a candidate
    schedule is timed as the MLP runs it (the epilogue's one launch where the schedule is `fusable`, else the
    projection and SiLU-and-mul); else None."""
    if not matmul_gated.enabled():
        return None
    for mlp in model.modules():
        if (isinstance(mlp, MLP) and not mlp.gate_up_proj._stock
                and tuple(mlp.gate_up_proj.weight.shape) == (site["n"], site["k"])):
            return mlp._select
    return None


def _attention_launcher(model: CausalLM, args: tuple, rand: Callable) -> Callable[[Any], Callable[[], Any]]:
    """A step of the recorded shape (batch, longest query, tokens, longest KV): in decode every
    sequence at the longest KV; in prefill the longest query at the longest KV, the other tokens
    spread over the other sequences from position 0. Keys already in the cache (random)."""
    batch, max_q, tokens, max_k = args
    c, page = model.config, model.page_size
    rest = tokens - max_q
    others = [rest // (batch - 1) + (i < rest % (batch - 1)) for i in range(batch - 1)] if batch > 1 else []
    q_lens = [max_q] + others
    cached = [max_k - n for n in q_lens] if max_q == 1 else [max_k - max_q] + [0] * len(others)
    pages = [-(-(k + n) // page) for k, n in zip(cached, q_lens)]
    table = torch.zeros(batch, max(pages), dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = torch.arange(at, at + n, dtype=torch.int32)
        at += n
    table = table.to(model.device)
    k_cache, v_cache = (rand(at, page, c.num_key_value_heads, c.head_dim) for _ in range(2))
    q = rand(tokens, c.num_attention_heads, c.head_dim)

    def make(s: Any) -> Callable[[], Any]:
        meta = attn_meta(q_lens, cached, table, *model.attention_tiling(s))
        return lambda: paged_attention(q, k_cache, v_cache, meta, scale=c.head_dim ** -0.5, block_n=s.block_n,
                                       split_size=s.split_size, num_splits=s.num_splits, num_warps=s.num_warps,
                                       num_stages=s.num_stages, prefetch=s.kv_prefetch, fixed_split=True)
    return make


def _thinned(calls: Counter) -> list[tuple[tuple, float]]:
    """At most MAX_CALLS (args, weight) pairs standing for `calls`: evenly spaced over the sorted
    distinct calls, each weighted by the counts of the stretch it stands for (the total is kept)."""
    items = sorted(calls.items())
    if len(items) <= MAX_CALLS:
        return [(a, float(n)) for a, n in items]
    edges = [round(i * len(items) / MAX_CALLS) for i in range(MAX_CALLS + 1)]
    return [(items[(lo + hi) // 2][0], float(sum(n for _, n in items[lo:hi]))) for lo, hi in zip(edges, edges[1:])]


def tune(model: CausalLM, workload: Workload | ServingWorkload, *,
         build: Optional[Callable[[CommitmentTuple], CausalLM]] = None, repeats: int = 5,
         families: tuple[str, ...] = TUNED, exhaustive: int = 0,
         log: Callable[[str], None] = print) -> tuple[CommitmentTuple, TuneReport]:
    """A new commitment tuple for `workload`: the model's resolved tuple with every measured site's
    assignment tuned (the sites of `families`; the others keep the tuple's values). `build(tuple)`
    (optional) makes a model with the tuned tuple; the workload then runs on it and on the profiled
    engine alternately, `repeats` rounds, and the medians check the prediction. `exhaustive` > 0: a
    site of at most that many distinct candidates is also measured whole, and the search's best is
    compared with the exhaustive best (the two re-timed side by side, `repeats` rounds each, so the
    minimum of many noisy timings does not flatter either). The model and its tuple are left as they
    were."""
    if repeats < 1:
        raise ValueError(f"repeats is {repeats}: at least 1 timing per candidate and one round of the check")
    sel = model.selections
    if sel.arm != "detent":
        raise ValueError(f"tuning commits pins of the detent arm; this model's arm is {sel.arm}")
    unknown = [f for f in families if f not in TUNED]
    if unknown:
        raise ValueError(f"families {unknown}: the tuner measures {', '.join(TUNED)}")
    report = TuneReport()
    engine = workload.engine(model)
    workload.run(engine)  # warm-up: compiles kernels, captures graphs
    report.profiled_s, calls = profile(engine, workload)
    resolved = sel.resolved()
    timer = kernel_timer(model.device, repeats)
    gen = torch.Generator(device=model.device).manual_seed(0)
    tuned: dict[str, SiteCommitment] = {}
    t0 = time.perf_counter()
    for key, (family, site) in sorted(sel.sites().items()):
        if key not in calls:
            continue
        sol = sel.solution(family, **site)
        if family not in families:
            if len(sol.legal) > 1:
                (report.untuned if family not in TUNED else report.skipped).append(key)
            continue
        if len(sol.legal) <= 1:
            continue
        site_t0 = time.perf_counter()
        launches = [(_launcher(model, family, site, args, gen), args, n) for args, n in _thinned(calls[key])]
        entry = resolved.sites[key]
        default = sol.assignment(dict(entry.pins), dict(entry.knobs))

        def cost(a: tuple, sol=sol, launches=launches) -> float:
            selector = sol.commit(*sol.split(a))
            return sum(n * timer(make(selector(*args))) for make, args, n in launches)
        distinct = candidates(family, sol, default, calls[key], sel.deployment.facts(family, site))
        found, measured = search(sol.axes, distinct, default, cost,
                                 budget=budget_for(len(sol.legal)))
        default_s, best_s, rejected = measured[default], measured[found], None
        best = found
        if found != default:  # kept only for a saving beyond the search's luck (`confirm`)
            best, default_s, found_s = confirm(default, found, cost, repeats)
            best_s = found_s if best == found else default_s
            rejected = None if best == found else (found, found_s)
        tuned[key] = SiteCommitment(*sol.split(best))
        site_report = SiteReport(key, family, len(sol.legal), len(measured), sum(calls[key].values()),
                                 default, best, default_s, best_s, sol.axes, rejected=rejected)
        if 0 < len(distinct) <= exhaustive:
            everything = {a: measured[a] if a in measured else cost(a) for a in distinct}
            top = min(everything, key=everything.get)
            pair = {top: [], found: []}  # the search's own best (before `confirm`): how far is the search?
            for _ in range(repeats):
                for a in pair:
                    pair[a].append(cost(a))
            site_report.exhaustive, site_report.exhaustive_n = top, len(distinct)
            site_report.gap = statistics.median(pair[found]) / statistics.median(pair[top]) - 1
            log(f"{key}: exhaustive best of {len(distinct)} {dict(zip(sol.axes, top))}; the search's best is "
                f"{site_report.gap:+.1%} from it (re-timed side by side)")
        report.sites.append(site_report)
        log(f"{key}: {dict(zip(sol.axes, best))} ({len(measured)} of {len(sol.legal)} legal measured, "
            f"{len(distinct)} distinct launches; "
            f"{site_report.default_s * 1e3:.3f} -> {site_report.best_s * 1e3:.3f} ms per workload run; "
            f"searched in {time.perf_counter() - site_t0:.1f} s)")
    report.search_s = time.perf_counter() - t0
    out = resolved.with_sites(tuned)
    if build is not None:
        # both engines alive and alternating, so drift and the second engine's cost fall on both alike
        checked = workload.engine(build(out))
        workload.run(checked)  # warm-up
        times: dict[Engine, list[tuple[float, float]]] = {engine: [], checked: []}
        for r in range(repeats):  # which goes first alternates: a place in the round favours neither
            for e in (engine, checked) if r % 2 == 0 else (checked, engine):
                times[e].append(workload.run_phases(e))
        totals = {e: [sum(t) for t in ts] for e, ts in times.items()}
        report.default_s, report.measured_s = (statistics.median(totals[e]) for e in (engine, checked))
        report.default_phases, report.measured_phases = (
            (statistics.median(t[0] for t in times[e]), statistics.median(t[1] for t in times[e]))
            for e in (engine, checked))
        report.round_savings = [a - b for a, b in zip(totals[engine], totals[checked])]
        report.rounds = repeats
    return out, report


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", help="derive the model, limits and workload from a recipe")
    ap.add_argument("overrides", nargs="*", help="recipe overrides key.sub=value")
    ap.add_argument("--model", help="a checkpoint directory or built-in name (without --recipe)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    step_shape = {"prompts": 8, "samples": 1, "prompt_len": 64, "new_tokens": 32, "micro_batch": 8}
    ap.add_argument("--prompts", type=int, help="workload: distinct prompts (without --recipe; default 8)")
    ap.add_argument("--samples", type=int, help="workload: requests per prompt, a GRPO group (without --recipe; "
                                                "default 1)")
    ap.add_argument("--prompt-len", type=int, help="workload: prompt tokens per request (default 64)")
    ap.add_argument("--new-tokens", type=int, help="workload: tokens each request decodes (default 32)")
    ap.add_argument("--micro-batch", type=int,
                    help="workload: sequences per trainer forward (at most: the step's tokens cut it too, as the "
                         "trainer's; default 8)")
    ap.add_argument("--serve", action="store_true",
                    help="workload: online serving, the bench's Poisson trace arriving while the engine steps "
                         "(ServingWorkload; without --recipe and the RL step's shape arguments)")
    ap.add_argument("--arrivals-per-step", type=float, default=0.1,
                    help="--serve: requests arriving per engine step, on average (the bench's Poisson case: ~0.1)")
    ap.add_argument("--requests", type=int, default=64, help="--serve: the trace's first N requests (the bench's: 64)")
    ap.add_argument("--max-num-seqs", type=int, default=64,
                    help="workload: the engine's slots, requests decoding at once, as a run's rollout.max_num_seqs "
                         "(without --recipe)")
    ap.add_argument("--step-graphs", nargs="?", const="on", default="auto", choices=("auto", "on", "off", "whole"),
                    help="workload: prefill steps through CUDA graphs, as a run's rollout.step_graphs (auto: "
                         "whole-step graphs on a CUDA device, the runs' default; on or the flag alone: the pieces; "
                         "whole) (without --recipe)")
    ap.add_argument("--chunk-size", type=int, default=256,
                    help="workload: chunked-prefill tokens a sequence a step, as a run's rollout.chunk_size (without "
                         "--recipe)")
    limits = {"max_context": 4096, "max_batch": 256, "max_num_tokens": 8192}  # load_model's defaults
    for name, default in limits.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int,
                        help=f"deployment limit, as the run will have it (without --recipe; default {default})")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timings per candidate call on the CPU, and the check's rounds (medians)")
    ap.add_argument("--exhaustive", type=int, default=0, metavar="N",
                    help="also measure every site of at most N distinct candidates whole: how far is the search?")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the check: the workload on the model's and the tuned tuple, alternately (additivity)")
    ap.add_argument("--families", default=",".join(TUNED),
                    help=f"comma-separated families to search, of {', '.join(TUNED)} (the rest keep the tuple's "
                         "values)")
    ap.add_argument("--commitment", help="start from this tuple (without --recipe; a recipe names its own): the "
                                         "families not searched keep its values")
    ap.add_argument("--out", required=True, help="the commitment-tuple JSON to write")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1 (timings per candidate call, and the check's rounds)")
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    if not families or [f for f in families if f not in TUNED]:
        ap.error(f"--families {args.families!r}: give some of {', '.join(TUNED)}")
    given = {name: getattr(args, name) for name in limits if getattr(args, name) is not None}
    shaped = [f"--{k.replace('_', '-')}" for k in step_shape if getattr(args, k) is not None]
    if args.serve and (args.recipe or shaped):
        ap.error(f"--serve tunes for the bench's Poisson trace; {', '.join(['--recipe'] * bool(args.recipe) + shaped)}"
                 " cannot be given with it")
    for k, v in step_shape.items():
        setattr(args, k, v if getattr(args, k) is None else getattr(args, k))
    if args.recipe:
        if given:
            ap.error(f"--recipe sets the deployment limits; {', '.join(given)} cannot be given with it")
        if args.commitment:
            ap.error("--recipe names its tuple (model.commitment); --commitment cannot be given with it")
        from detent_rl.train import USER_ERRORS
        try:  # a recipe, its data or its model refused: one line, as the run would say it
            model, workload, build = recipe_workload(args.recipe, args.overrides)
        except USER_ERRORS as e:
            ap.error(str(e))
    else:
        if not args.model:
            ap.error("give --recipe, or --model (and the workload's shape)")
        from detent_rl.cli_checks import model_on_device
        from detent_rl.models import load_model
        try:
            path = model_on_device(args.model, args.device)
        except ValueError as e:
            ap.error(str(e))
        kw = dict(device=args.device, dtype=getattr(torch, args.dtype), **{**limits, **given})
        try:  # a tuple that cannot be read, or was made for another deployment or model, stops here
            start = CommitmentTuple.load(args.commitment) if args.commitment else None
            model = load_model(path, "detent", commitment=start, **kw)
        except CommitmentError as e:
            ap.error(f"--commitment: {e}")
        pieces = {"auto": "whole" if args.device.startswith("cuda") else False, "on": True, "off": False,
                  "whole": "whole"}[args.step_graphs]
        try:
            workload = ServingWorkload(args.requests, arrivals_per_step=args.arrivals_per_step,
                                       max_num_seqs=args.max_num_seqs,
                                       step_graphs=pieces, chunk_size=args.chunk_size) if args.serve else \
                Workload(args.prompts, args.prompt_len, args.new_tokens, args.micro_batch, args.max_num_seqs,
                         args.samples, pieces, chunk_size=args.chunk_size)
        except ValueError as e:
            ap.error(str(e))
        build = lambda t: load_model(path, "detent", commitment=t, **kw)  # noqa: E731
    try:
        workload.check(model.selections.deployment)
    except ValueError as e:
        ap.error(str(e))
    if model.device.type == "cpu":
        torch.set_num_threads(1)
    print(f"tuning for {workload} on {model.device}")
    tuple_, report = tune(model, workload, build=None if args.no_check else build, repeats=args.repeats,
                          families=families, exhaustive=args.exhaustive)
    print(report.render())
    tuple_.save(args.out)
    print(f"wrote {args.out} ({len(tuple_.sites)} sites, sha256 {tuple_.sha256()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
