"""Where a decode step's time goes, per arm: wall time, GPU kernel time and each kernel's share.

Run on a CUDA machine from the repository root:

    python bench/decode_profile.py [--model qwen2-0.5b] [--batch 1,32] [--arms stock,detent] [--steps 64] \
        [--pdl on,off] [--temperature 1] [--prompt-len 128] [--phase prefill] [--samples 8] \
        [--host-top 20] [--commitment TUPLE.json] [--gated-mlp off,on]

Each arm loads the same checkpoint (a built-in config's seeded random weights, or a directory),
decodes `--batch` greedy requests (seeded sampling with `--temperature T`) from `--prompt-len`-token
prompts with CUDA-graph decode, times the `--steps` decode steps after every request's first token
(median of three runs after a warm-up that captures the graphs), and profiles them once more with
the torch profiler (CUPTI reports each kernel a graph replay launches). Prints per arm and batch:
wall ms per step, the GPU's busy ms per step (the kernels' spans' union; the rest of the wall is host
time and launch gaps) and the kernels' own times summed, the rest split into gaps between a step's kernels
(under 20 µs: inside the replayed graph, by kernel pair) and between steps (the host), and the kernels by
time per step with their launches per step. Kernel names are shortened (Triton kernels keep their function name;
cuBLAS/CUTLASS kernels their family). `--pdl on,off` runs each arm and batch with our kernels'
programmatic dependent launch on and off (DETENT_PDL), in one process. With PDL a kernel may be
resident while its predecessor drains, so kernel times can overlap: compare the wall times.
`--phase prefill` profiles the batch's whole prefill instead (until every request has its first token;
`--samples 8` repeats each prompt as the GRPO batch does, so the prefix cache serves the repeats), and
`--host-top N` adds the host's costliest functions in it. `--commitment` adds the arm `tuned`. `--step-graphs`
runs the prefill through piecewise graphs (`rollout/step_graphs.py`; captured in the untimed first run).
`--by-slot` splits each decode kernel's row by its place in the layer: the linear's four sites a layer apart, and the
launches after the layers (the last RMSNorm, the LM head) apart.
`--gated-mlp off,on` runs each arm and batch without and with SiLU-and-mul in the gate/up projection's epilogue
(DETENT_GATED_MLP; the stock arm's cuBLAS MLP ignores it), in one process.
"""
from __future__ import annotations

import argparse
import functools
import os
from collections import defaultdict

import torch

from detent_rl.bench_cases import decode_step_seconds, phase_seconds, prefilled
from detent_rl.kernel_times import short
from detent_rl.kernels import autograd
from detent_rl.kernels.attention import paged_attention
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams


def profile_decode(engine: Engine, prompts: list[list[int]], steps: int, temperature: float = 0.0,
                   layers: int = 0) -> tuple[float, float, dict, dict]:
    """(wall ms per step, GPU ms per step, {kernel: (launches per step, µs per step)}, gaps) over the
    decode steps after every request's first token (greedy, or seeded sampling at `temperature`); with `layers`,
    the kernels by their place in the layer (`_per_slot`)."""
    from torch.profiler import ProfilerActivity, profile
    params = [SamplingParams(seed=i, temperature=temperature, max_tokens=steps + 1) for i in range(len(prompts))]
    walls = sorted(decode_step_seconds(engine, prompts, params) for _ in range(4))[1:]  # the first warms up
    prefilled(engine, prompts, params)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        while not engine.idle:
            engine.step()
        torch.cuda.synchronize()
    gpu, kernels, gaps = _per_kernel(p, steps)
    return 1e3 * walls[1], gpu, _per_slot(p, steps, layers) if layers else kernels, gaps


def profile_prefill(engine: Engine, prompts: list[list[int]], temperature: float = 0.0, host_top: int = 0,
                    ) -> tuple[float, float, dict, dict]:
    """The same for the whole prefill (every request's prompt through the model and its first token
    sampled, in the engine's steps of at most max_num_tokens; repeated prompts hit the prefix cache):
    ms, and µs per prefill. `host_top`: also print the host's functions by own time in one more prefill
    (cProfile: time a function spends waiting for the device counts as its own)."""
    from torch.profiler import ProfilerActivity, profile
    params = [SamplingParams(seed=i, temperature=temperature, max_tokens=1) for i in range(len(prompts))]
    walls = sorted(phase_seconds(engine, prompts, params)[0] for _ in range(4))[1:]
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        prefilled(engine, prompts, params)
        torch.cuda.synchronize()
    if host_top:
        import cProfile
        import pstats
        with cProfile.Profile() as host:
            prefilled(engine, prompts, params)
        pstats.Stats(host).sort_stats("tottime").print_stats(host_top)
    return (1e3 * walls[1],) + _per_kernel(p, 1)


def _kernels(prof) -> list:
    """The profile's kernel events (the device's, with time)."""
    return [e for e in prof.events() if e.device_time > 0 and e.device_type == torch.autograd.DeviceType.CUDA]


def _per_kernel(p, steps: int) -> tuple[float, dict, dict]:
    """(GPU ms, {kernel: (launches, µs)}, gaps), each per step, from a profile of `steps` steps."""
    gaps = _gaps(p, steps)
    per = defaultdict(lambda: [0, 0.0])
    for e in _kernels(p):
        k = per[short(e.name)]
        k[0] += 1
        k[1] += e.device_time
    kernels = {n: (c / steps, us / steps) for n, (c, us) in per.items()}
    return sum(us for _, us in kernels.values()) / 1e3, kernels, gaps


def _per_slot(prof, steps: int, layers: int) -> dict:
    """{kernel and its place in the layer: (launches, µs)} per step: a kernel launched n = a * layers + b times a step
    (every step replays the same launches) has its launches in a step numbered by start time, the first a * layers
    labelled by their place among the layer's a (in a Qwen2 layer the linear's four: qkv, o, gate_up, down) and the b
    after them apart (the last RMSNorm, the LM head); one launched fewer than `layers` times a step, by its place in
    the step. A kernel whose count is not a multiple of `steps` keeps one row.
    It assumes a kernel's extra launches in a step come after its layer launches, as in a decode step."""
    spans = defaultdict(list)
    for e in _kernels(prof):
        spans[short(e.name)].append((e.time_range.start, e.device_time))
    per = defaultdict(lambda: [0, 0.0])
    for name, runs in spans.items():
        n, rest = divmod(len(runs), steps)
        a = n // layers if not rest else 0
        for j, (_, us) in enumerate(sorted(runs)):
            i = j % n if not rest else 0
            label = (name if rest or n == 1 else f"{name} [{i + 1} of {n} a step]" if not a
                     else f"{name} [{i % a + 1} of {a} a layer]" if i < a * layers
                     else f"{name} [after the layers, {i - a * layers + 1}]")
            per[label][0] += 1
            per[label][1] += us
    return {k: (c / steps, us / steps) for k, (c, us) in per.items()}


def _gaps(prof, steps: int, host_gap_us: float = 20.0) -> dict:
    """The device's busy time (the kernels' spans' union) and its idle time between kernels, per step: short
    gaps (inside a replayed graph) by the kernel pair around them, and long ones (the host between steps) in
    total. Under PDL a kernel's span opens while its predecessor still runs (its programs resident, waiting),
    so spans overlap, and the device idles only where no span is open: a gap runs from the latest end so far
    (before, from the previous span's end, which counted time under a longer, overlapping span as idle)."""
    spans = sorted((e.time_range.start, e.time_range.end, short(e.name)) for e in _kernels(prof))
    pairs, host, busy = defaultdict(float), 0.0, 0.0
    last_end, last = (spans[0][0] if spans else 0.0), ""  # the first span opens with no gap before it
    for start, end, name in spans:
        gap = start - last_end
        if gap >= host_gap_us:
            host += gap
        elif gap > 0:
            pairs[f"{last} -> {name}"] += gap
        busy += max(0.0, end - max(start, last_end))
        if end > last_end:
            last_end, last = end, name
    return {"host_us": host / steps, "in_graph_us": sum(pairs.values()) / steps, "busy_us": busy / steps,
            "pairs": sorted(((k, v / steps) for k, v in pairs.items()), key=lambda kv: -kv[1])[:6]}


def attention_pinned(model, split: int, max_context: int):
    """`model`'s resolved tuple with its attention split into `split`-key ranges (0: one split)."""
    from detent_rl.kernels.commitment import SiteCommitment
    t = model.selections.resolved()
    span = -(-max_context // 64) * 64
    pins = {"block_n": 64, "num_splits": -(-max_context // split) if split else 1, "split_size": split or span}
    return t.with_sites({k: SiteCommitment(pins, {"split_stride": 0}) for k in t.sites if k.startswith("attention")})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--arms", default="stock,detent")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else seeded sampling (the GRPO "
                                                                     "batch samples at 1)")
    ap.add_argument("--pdl", default="on", help="comma-separated on/off: our kernels' programmatic dependent "
                                               "launch, one run each (DETENT_PDL)")
    ap.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                    help="prefill: profile the whole prefill of the batch's prompts instead of decode steps")
    ap.add_argument("--samples", type=int, default=1, help="each prompt this many times in a row (the GRPO "
                                                             "batch: 8), so that the prefix cache serves the repeats")
    ap.add_argument("--host-top", type=int, default=0, help="prefill: also print the host's N costliest functions")
    ap.add_argument("--combine", default="auto", help="comma-separated auto/on/off: attention with one split "
                                                      "through the combine kernel (on), written by the attention "
                                                      "kernel (off), or as paged_attention decides (auto)")
    ap.add_argument("--commitment", default="", help="a tuned tuple file: adds the arm `tuned` (detent with it), "
                                                     "and every arm takes the tuple's deployment limits")
    ap.add_argument("--step-graphs", action="store_true", help="prefill and mixed steps through piecewise graphs")
    ap.add_argument("--gated-mlp", default="off", help="comma-separated off/on: the pinned arms' SiLU-and-mul in the "
                                                        "gate/up projection's epilogue, one run each "
                                                        "(DETENT_GATED_MLP, kernels/matmul_gated.py)")
    ap.add_argument("--by-slot", action="store_true", help="decode: each kernel's rows by its place in the layer "
                                                              "(the linear's qkv, o, gate_up and down apart)")
    ap.add_argument("--attention-split", default="", help="comma-separated KV split sizes to pin the detent arm's "
                                                            "attention to, one run each (default: its tuple's)")
    args = ap.parse_args()
    gated_runs = [g.strip() for g in args.gated_mlp.split(",") if g.strip()]
    if not gated_runs or [g for g in gated_runs if g not in ("on", "off")]:
        ap.error(f"--gated-mlp {args.gated_mlp!r}: give off, on or off,on")
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    batches = [int(b) for b in args.batch.split(",")]
    limits = dict(max_context=args.prompt_len + args.steps + 32, max_batch=max(64, max(batches)), max_num_tokens=8192)
    commitment = CommitmentTuple.load(args.commitment) if args.commitment else None
    if commitment is not None:
        limits = {k: commitment.deployment[k] for k in limits}
        if args.prompt_len + args.steps + 2 > limits["max_context"] or max(batches) > limits["max_batch"]:
            ap.error(f"--commitment {args.commitment}: its deployment ({limits}) is smaller than --batch "
                     f"{args.batch} of --prompt-len + --steps + 2 = {args.prompt_len + args.steps + 2} tokens")
    runs = [(arm, None) for arm in args.arms.split(",")] + ([("tuned", None)] if commitment is not None else [])
    if args.attention_split:
        runs = [r for r in runs if r[0] != "detent"] + [("detent", int(s)) for s in args.attention_split.split(",")]
    for arm, split in runs:
        model = load_model(path, "detent" if arm == "tuned" else arm, device="cuda", dtype=torch.bfloat16,
                           commitment=commitment if arm == "tuned" else None, **limits)
        if split is not None:
            model = load_model(path, arm, device="cuda", dtype=torch.bfloat16,
                               commitment=attention_pinned(model, split, limits["max_context"]), **limits)
            arm = f"detent, attention split {split}"
        for b, pdl, combine, gated in [(b, p, c, g) for b in batches for p in args.pdl.split(",")
                                       for c in args.combine.split(",")
                                       for g in (["off"] if arm == "stock" else gated_runs)]:  # stock: cuBLAS's MLP
            os.environ["DETENT_PDL"] = "1" if pdl == "on" else "0"  # read at each launch, so at graph capture
            os.environ["DETENT_GATED_MLP"] = "1" if gated == "on" else "0"  # read at each MLP call (and capture)
            forced = {"on": True, "off": False}.get(combine)  # auto: None, paged_attention's rule
            autograd.paged_attention = functools.partial(paged_attention, combine=forced)
            g = torch.Generator().manual_seed(b)
            prompts = torch.randint(0, model.config.vocab_size, (-(-b // args.samples), args.prompt_len),
                                    generator=g).repeat_interleave(args.samples, 0)[:b].tolist()
            engine = Engine.for_requests(model, b, args.prompt_len + args.steps + 2, b, step_graphs=args.step_graphs)
            if args.phase == "prefill":
                wall, gpu, kernels, gaps = profile_prefill(engine, prompts, args.temperature, args.host_top)
            else:
                wall, gpu, kernels, gaps = profile_decode(engine, prompts, args.steps, args.temperature,
                                                          model.config.num_hidden_layers if args.by_slot else 0)
            launches = sum(c for c, _ in kernels.values())
            unit = "prefill" if args.phase == "prefill" else "step"
            print(f"\n## {args.model}, arm {arm}, PDL {pdl}, one-split combine {combine}, gated MLP {gated}, "
                  f"batch {b}, "
                  + ("step graphs, " if args.step_graphs else "") +
                  f"T {args.temperature:g}, {args.phase}: "
                  f"{wall:.3f} ms/{unit} wall, GPU busy {gaps['busy_us'] / 1e3:.3f} ms/{unit} (kernels summed "
                  f"{gpu:.3f}, {launches:.0f} launches/{unit}), {wall - gaps['busy_us'] / 1e3:.3f} ms/{unit} host "
                  f"and gaps: between kernels {gaps['in_graph_us'] / 1e3:.3f}, longer gaps (the host) "
                  f"{gaps['host_us'] / 1e3:.3f} (profiled run)\n")
            print(f"largest gaps between kernels (µs/{unit}): " + "; ".join(f"{k} {v:.1f}" for k, v in gaps["pairs"]))
            print(f"| kernel | launches/{unit} | µs/{unit} | µs/launch |\n|---|---|---|---|")
            for name, (c, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]:
                print(f"| {name} | {c:.0f} | {us:.1f} | {us / c if c else float('nan'):.2f} |")
            del engine
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
