"""The rollout benchmark's tables and plot (`python -m detent_rl.bench`), and its rounds folded into one result.

With `--rounds R` every arm runs R times in turn (stock, detent, ..., stock, detent, ...), each round loading
its models afresh. A case's ratio is then the median of the rounds' paired ratios (an arm's run over the
same round's stock run), so a drift of the machine between rounds moves both sides of each ratio; the
result shown per arm is its median round's. Every round's results stay in `rounds`.
"""
from __future__ import annotations

import statistics
from pathlib import Path

MAIN_METRIC = {"decode-1": "ms_per_step", "decode-32": "ms_per_step", "poisson": "p50_ms", "long": "ms_per_step"}
VARIANTS = ("pieces", "whole", "gated")  # an arm's runs through piecewise step graphs / whole-step graphs / with the
# gated MLP epilogue, beside its plain runs (`--step-graphs off,on` or `on,whole`, `--gated-mlp off,on`): named
# `<arm> + pieces`, `<arm> + whole`, `<arm> + pieces + gated`, ...


def variant(arm: str, *flags: str) -> str:
    """The arm's run with `flags` (of VARIANTS) added to its own, named in VARIANTS' order."""
    base, *have = arm.split(" + ")
    return " + ".join([base] + [v for v in VARIANTS if v in have or v in flags])


def baseline(arm: str) -> str:
    """The stock run an arm's time is over: stock's own kind of run, the same engine features on both sides
    (`stock + pieces` for an arm's graphed runs); stock never takes the gated MLP (a stock engine runs cuBLAS and
    the separate SiLU-and-mul kernel), so a gated run is over the plain stock run."""
    return variant("stock", *(v for v in arm.split(" + ")[1:] if v != "gated"))


def time_vs_stock(case: str, r: dict, stock: dict) -> float:
    """An arm's time over stock's on a case (throughput inverted for the GRPO batch)."""
    if case == "grpo":
        return stock["tok_per_s"] / r["tok_per_s"]
    return r[MAIN_METRIC[case]] / stock[MAIN_METRIC[case]]


def ratio(results: dict, case: str, arm: str) -> float:
    """The case's time vs its stock run (`baseline`): the median of the rounds' paired ratios where there were
    rounds."""
    rounds = results.get("round_ratios", {}).get(case, {}).get(arm)
    if rounds:
        return statistics.median(rounds)
    if baseline(arm) not in results["cases"][case]:  # a run without its stock run (one isolated run: bench_isolate)
        return float("nan")
    return time_vs_stock(case, results["cases"][case][arm], results["cases"][case][baseline(arm)])


def effect(results: dict, case: str, arm: str, flag: str) -> tuple[float, list[float]]:
    """An arm's time with `flag` (of VARIANTS) over its time without, on a case: the median of the rounds'
    paired ratios (each round's run with it over the same round's run without), and those ratios."""
    rounds = results.get("rounds") or [results["cases"]]
    each = [time_vs_stock(case, r[case][variant(arm, flag)], r[case][arm]) for r in rounds]
    return statistics.median(each), each


def merge_rounds(rounds: list[dict]) -> dict:
    """One result from several rounds of `run` (the first round's run also holds the gemm case, which
    later rounds skip): per case and arm the median round's result, the paired ratios of every round,
    and every round's results."""
    results = dict(rounds[0])
    if len(rounds) == 1:
        return results
    cases, ratios = {}, {}
    for case, arms in rounds[0]["cases"].items():
        if case == "gemm":
            cases[case] = arms
            continue
        runs = {arm: [r["cases"][case][arm] for r in rounds] for arm in arms}
        ratios[case] = {arm: [time_vs_stock(case, r["cases"][case][arm], r["cases"][case][baseline(arm)])
                              for r in rounds] for arm in arms}
        cases[case] = {arm: _median_run(case, rs) for arm, rs in runs.items()}
    stock_runs: dict[str, list] = {}
    for r in rounds:
        for case, rs in r["stock_runs"].items():
            stock_runs.setdefault(case, []).extend(rs)
    results.update(cases=cases, round_ratios=ratios, stock_runs=stock_runs,
                   rounds=[{c: a for c, a in r["cases"].items() if c != "gemm"} for r in rounds])
    return results


def _median_run(case: str, runs: list[dict]) -> dict:
    if case == "grpo":
        return sorted(runs, key=lambda r: -r["tok_per_s"])[len(runs) // 2]
    return sorted(runs, key=lambda r: r[MAIN_METRIC[case]])[len(runs) // 2]


def _tokens(r: dict) -> str:
    """The Poisson serve's eager steps' sizes (prefill chunks and mixed steps), where the run recorded them."""
    if "eager_tokens_max" not in r:
        return ""
    return f", median {r['eager_tokens_median']:,.0f} tokens, max {r['eager_tokens_max']:,}"


def _serves(r: dict) -> str:
    """The serves a Poisson result is the median of (`Bench.poisson`), with their p50s' range."""
    each = r.get("serves_p50_ms") or []
    if len(each) < 2:
        return ""
    return f" (median p50 of {len(each)} serves: {min(each):.2f}-{max(each):.2f})"


def _kernel_table(arms: dict, top: int = 12) -> list[str]:
    """The Poisson serves' time by kernel (`--kernels`), the `top` costliest over the arms, and each arm's total."""
    timed = {arm: {name: (n, ms) for name, n, ms in r["kernels"]} for arm, r in arms.items() if r.get("kernels")}
    if not timed:
        return []
    names = sorted({k for t in timed.values() for k in t}, key=lambda k: -max(t.get(k, (0, 0.0))[1]
                                                                             for t in timed.values()))
    out = ["", "Poisson, one more serve under the profiler: ms by kernel (launches; µs a launch), the costliest over "
           "the arms (on CUDA each kernel's exclusive time: under PDL a kernel's span opens while its predecessor "
           "runs, and that wait is the predecessor's; `all` is then the device's busy time):", "",
           "| kernel | " + " | ".join(timed) + " |", "|---|" + "---|" * len(timed)]
    cell = lambda n, ms: f"{ms:.1f} ({n:,}; {1e3 * ms / n:.1f} µs)"  # noqa: E731
    for name in names[:top]:
        out.append(f"| {name} | " + " | ".join(cell(*t[name]) if name in t else "-" for t in timed.values()) + " |")
    out.append("| all | " + " | ".join(f"{sum(ms for _, ms in t.values()):.1f} ({sum(n for n, _ in t.values()):,})"
                                        for t in timed.values()) + " |")
    return out


def _each_round(results: dict, case: str, arm: str) -> str:
    """`; rounds a, b, c`: the arm's own figure in each round, in run order (where there were rounds). A paired ratio
    hides which side of it moved: an arm that runs slower after other arms ran in its process shows here."""
    rounds = [r[case][arm] for r in results.get("rounds", ()) if arm in r.get(case, {})]
    if len(rounds) < 2:
        return ""
    if case == "grpo":
        return "; rounds " + ", ".join(f"{r['tok_per_s']:,.0f}" for r in rounds)
    return "; rounds " + ", ".join(f"{r[MAIN_METRIC[case]]:.3f}" for r in rounds)


def render(results: dict) -> str:
    rounds = len(results.get("rounds", ())) or 1
    head = "time vs stock" if rounds == 1 else f"time vs stock, median of {rounds} rounds (each round's)"
    asked = results.get("rounds_asked", rounds)
    out = [f"device {results['device']}; copy bandwidth {results['copy_bandwidth_gbs']:.0f} GB/s (read + write); "
           f"weights {results['weight_bytes'] / 1e9:.3f} GB" + (f"; {rounds} of {asked} rounds done" if asked > rounds
                                                               else "")
           + {True: "; prefill and mixed steps through piecewise graphs, every arm",
              "whole": "; prefill and mixed steps through whole-step graphs (attention inside), every arm",
              "both": "; each arm also through piecewise step graphs ('+ pieces', over stock's graphed run)",
              "pieces,whole": "; prefill and mixed steps through piecewise graphs, each arm also through whole-step "
                              "graphs ('+ whole', over stock's)",
              "off,whole": "; prefill and mixed steps without step graphs, each arm also through whole-step graphs "
                           "('+ whole', over stock's)"}.get(results.get("step_graphs"), "")
           + ("; the gated MLP epilogue on (DETENT_GATED_MLP=1)" if results.get("gated_mlp") is True
              else "; the pinned arms also with the gated MLP epilogue ('+ gated', over stock's run)"
              if results.get("gated_mlp") == "both" else "")
           + (f"; Poisson arrivals {results['poisson_rate_per_s']:.1f} requests/s" if "poisson_rate_per_s" in results
              else "")
           + ("; each arm's run in a process of its own" if results.get("isolated") else ""),
           "",
           f"| case | arm | result | {head} |", "|---|---|---|---|"]
    for case, arms in results["cases"].items():
        if case == "gemm":
            continue
        for arm, r in arms.items():
            if case == "grpo":
                text = f"{r['tok_per_s']:,.0f} tok/s" + (
                    f" (prefill {1e3 * r['prefill_s']:.0f} ms, then {r['decode_ms_per_step']:.3f} ms/step)"
                    if "prefill_s" in r else "")
            elif case == "poisson":
                text = f"p50 {r['p50_ms']:.2f} / p90 {r['p90_ms']:.2f} / p99 {r['p99_ms']:.2f} ms per output token" + (
                    _serves(r)) + (
                    f"; {r['steps']} steps, median {r['step_median_ms']:.2f} ms, slowest {r['step_max_ms']:.1f} ms"
                    if "step_max_ms" in r else "") + (
                    f" (an eager step of {r['step_max_tokens']:,} tokens)" if r.get("step_max_tokens") else
                    " (a decode replay)" if "step_max_tokens" in r else "") + (
                    f", {r['captures']} graphs captured" if "captures" in r else "") + (
                    f" ({r['eager_steps']} eager{_tokens(r)}: {r['eager_ms']:.0f} ms; the rest {r['graph_ms']:.0f} ms)"
                    if "eager_ms" in r else "") + (f"; {r['compiles']} compiles" if "compiles" in r else "") + (
                    f"; GC {r['gc_full']} full passes, {r['gc_ms']:.0f} ms in all ({r['gc_step_max_ms']:.1f} in the "
                    "slowest step)" if "gc_ms" in r else "") + (
                    f"; warm-up {r['warmup_s']:.1f} s, {r['warmup_mib']:,.0f} MiB" if "warmup_mib" in r else "")
            else:
                text = f"{r['ms_per_step']:.3f} ms/step" + (f", {r['roofline_pct']:.0f} % of roofline"
                                                            if "roofline_pct" in r else "")
            text += _each_round(results, case, arm)
            label = f"{arm} (PDL {r['pdl']})" if baseline(arm) == arm and "pdl" in r else arm
            each = results.get("round_ratios", {}).get(case, {}).get(arm)
            spread = f" ({', '.join(f'{x:.2f}' for x in each)})" if each else ""
            out.append(f"| {case} | {label} | {text} | {ratio(results, case, arm):.2f}x{spread} |")
    for flag, what in (("pieces", "through the pieces"), ("whole", "through whole-step graphs"),
                       ("gated", "with the gated MLP epilogue")):
        twins = [(case, arm) for case, arms in results["cases"].items() if case != "gemm" for arm in arms
                 if flag not in arm.split(" + ") and variant(arm, flag) in arms]
        if not twins:
            continue
        out += ["", f"Time {what} over without, the same arm (median of the rounds' paired ratios):", "",
                "| case | arm | time with / without |", "|---|---|---|"]
        for case, arm in twins:
            mid, each = effect(results, case, arm, flag)
            out.append(f"| {case} | {arm} | {mid:.2f}x" + (f" ({', '.join(f'{x:.2f}' for x in each)})"
                                                           if len(each) > 1 else "") + " |")
    tuples = results.get("commitment") or {}
    if len({t["file"] for t in tuples.values()}) > 1:  # each case's tuple, where they differ
        out += ["", "tuned: " + "; ".join(f"{case} with {t['file']} ({t['sha256'][:12]})"
                                          for case, t in tuples.items())]
    limits = results.get("limits") or {}
    if len({tuple(sorted(v.items())) for v in limits.values()}) > 1:  # each case's deployment, where they differ
        out += ["", "limits (every arm; corun's max_batch below): " + "; ".join(
            f"{case} {', '.join(f'{k} {v:,}' for k, v in sorted(lim.items()))}" for case, lim in limits.items())]
    padded = {case: arms["corun"]["max_batch"] for case, arms in results["cases"].items()
              if "max_batch" in arms.get("corun", {})}
    if padded:  # CoRun's decode rows: its deployment's maximum concurrency, each case's own (`bench.deployment`)
        out += ["", "corun's max_batch, the rows of its padded decode: " + "; ".join(
            f"{case} {rows:,}" for case, rows in padded.items())]
    out += _kernel_table(results["cases"].get("poisson", {}))
    gemm = results["cases"].get("gemm", {})
    if gemm:
        arms = [a for a in gemm if gemm[a].get("sites")]  # every arm but stock (cuBLAS is the column)
        out += ["", "Our kernel over cuBLAS, alone (PDL off) / with PDL on (replays overlapping):", "",
                "| site | M | cuBLAS µs | " + " | ".join(arms) + " |", "|---|---|---|" + "---|" * len(arms)]
        by_arm = {a: {(r["site"], r["m"]): r for r in gemm[a]["sites"]} for a in arms}
        for key, r in by_arm[arms[0]].items() if arms else ():
            cells = [(f"{by_arm[a][key]['ratio']:.2f}x" + (f" / {by_arm[a][key]['ratio_pdl']:.2f}x"
                                                           if "ratio_pdl" in by_arm[a][key] else "")
                      + f" (chunk {by_arm[a][key]['chunk']})") if key in by_arm[a] else "-" for a in arms]
            out.append(f"| {r['site']} | {r['m']} | {r['cublas_us']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = [c for c in results["cases"] if c != "gemm" and results["cases"][c]]
    fig, ax = plt.subplots(figsize=(1.6 * len(cases) + 2, 3.5))
    arms = results["arms"]
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        ratios = [ratio(results, c, arm) if arm in results["cases"][c] else float("nan") for c in cases]
        ax.bar([i + j * width for i in range(len(cases))], ratios, width, label=arm)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width for i in range(len(cases))], cases)
    ax.set_ylabel("time vs stock (lower is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
