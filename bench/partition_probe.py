"""Probe: can one K partition serve both ends of a cut site? Each legal partition, decode to prefill, against cuBLAS.

    python3 -P bench/partition_probe.py [--models 0.5b,1.5b] [--sites down] [--chunks all|640,1280,...] [--explore]
        [--ms 1,8,32,64,128,256,512,640,1024,2048,8192] [--budget-s 540] [--json PATH] [--resume PATH] [--plan]

A row's bits are fixed by its site's K partition (`chunk`), one value for every M: the default cuts the down
projections into as many chunks as a decode call needs CTAs (0.5B: 8 of 640, 1.5B: 5 of 1,792), and at M >= 512
each chunk's end then costs the sequential form a wait and the register budget of a second accumulator (sessions
24, 31, 32: "one pinned partition cannot serve both ends"). That finding came from partitions measured in the
selection's tiles, which were chosen for the default partition: with fewer chunks a decode call has fewer units
in those tiles, not necessarily fewer in narrower, deeper ones. So for every legal partition of the site (the
selection program's candidates) and every M this times:

- cuBLAS (`torch.nn.functional.linear`);
- `selected`: what the engine would run with the partition pinned (the detent selection, `launch_params`);
- `best`: the fastest of a grid, with its form: the plain Triton kernel's parallel (`P`) and sequential (`S`)
  tiles, among them narrow deep-K ones at M <= 64 (16 x 16 / 16 x 32 tiles of 256-512-element K blocks: a few
  row tiles of a decode call need many columns' CTAs, each with enough bytes in flight), and the warpgroup
  kernel's forms (`w`: sequential; `wS`: the chunks in parallel programs; `swap`; `P` suffix: persistent).

Every output is compared with the partition's reference computed once at the largest M (the first rows of one
big call): each form at each M must equal it bit for bit (`bits`), which is the invariance the pin buys; cuBLAS
against the same rows is the control (`cuBLAS=`: it differs at some M, or the check proves nothing). Then, per
partition, the worst ratio at M <= 64 (issue 10's goal: 1.3x) and at M >= 512 (1.15x), selected and best: a
partition whose best meets both says the default's partition, or its schedule table, is what misses.

Times: CUDA-graph replays (`detent_rl.timing.graph_seconds`) over cold weight copies, median µs. `--budget-s`
stops timing new rows past that many seconds and prints the summary of those done (a device call's limit).
`--plan` prints, on any machine, each partition's selected schedule and grid size per M, and times nothing.
`--explore` lets `--chunks` name cuts the program does not reach (e.g. the o or qkv projection in two chunks, so that
a mid-M call could run split where K whole leaves the SMs idle): those are timed in the grid only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matmul_sweep import SITES  # noqa: E402  (name, n, k, bias) per model and site

from detent_rl.kernels.commitment import CommitmentTuple  # noqa: E402
from detent_rl.kernels.matmul import launch_params, linear  # noqa: E402
from detent_rl.kernels.matmul_wgmma import tile_fits  # noqa: E402
from detent_rl.kernels.programs.matmul import CHUNK_ALIGN  # noqa: E402
from detent_rl.kernels.selections import Deployment, KernelSelections, site_key  # noqa: E402
from detent_rl.models.builtin import BUILTINS  # noqa: E402

MODELS = {"0.5b": "qwen2-0.5b", "1.5b": "qwen2-1.5b"}
MS = "1,8,32,64,128,256,512,640,1024,2048,8192"
SMALL_M, LARGE_M = 64, 512  # issue 10's two ends: within 1.3x cuBLAS at M <= 64, 1.15x at M >= 512
GOALS = {SMALL_M: 1.3, LARGE_M: 1.15}
# the plain Triton kernel: block_m, block_n, block_k, warps, stages
NARROW = [(16, 64, 128, 4, 4), (16, 16, 128, 4, 8), (16, 32, 128, 4, 8), (32, 32, 128, 4, 6), (16, 16, 256, 4, 4),
          (16, 16, 512, 4, 4), (16, 32, 256, 4, 4), (16, 32, 512, 4, 3)]  # M <= 64: the decode tile, then narrow ones
# with deep rings or deep K blocks (chunks are multiples of 128 only, so the 256-512 blocks fit some partitions)
MID = [(64, 64, 64, 4, 3), (64, 128, 64, 4, 3)]  # 64 < M <= 640
# the warpgroup kernel: block_m, block_n, block_k, ring, swap_ab, split (parallel chunks), largest M tried at
WGMMA = [(32, 64, 64, 6, True, False, 64), (64, 64, 64, 6, True, False, 128),
         (64, 64, 64, 6, False, True, 1024), (64, 128, 64, 4, False, True, 1024), (128, 128, 64, 4, False, True, 2048),
         (64, 64, 64, 6, False, False, 1024), (64, 128, 64, 4, False, False, 8192),
         (128, 128, 64, 4, False, False, 8192), (128, 128, 128, 3, False, False, 8192),
         (128, 256, 64, 3, False, False, 8192)]


def deployment(model: str, num_sms: int, smem_bytes: int) -> Deployment:
    """The built-in model's deployment at the bench's Poisson limits (the matmul selection reads only its width,
    depth of K, `max_num_tokens` and the device facts)."""
    c = BUILTINS[MODELS[model]].config
    return Deployment(num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
                      head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]), hidden=c["hidden_size"],
                      vocab=c["vocab_size"], max_context=784, max_batch=256, max_num_tokens=8192, num_sms=num_sms,
                      smem_bytes=smem_bytes)


def legal_partitions(dep: Deployment, n: int, k: int) -> list[int]:
    """The site's legal partitions: the selection program's candidates for `chunk`."""
    return sorted(KernelSelections(dep).solution("matmul", n=n, k=k).candidates["chunk"])


def partitions(dep: Deployment, n: int, k: int, chunks: str, explore: bool = False) -> list[int]:
    """The site's legal partitions, or the listed ones (0: K whole), each checked legal; with `explore`, any whole
    number of CHUNK_ALIGN blocks up to K (a partition the program does not reach yet: no `selected` for it)."""
    legal = legal_partitions(dep, n, k)
    if chunks == "all":
        return legal
    asked = [int(c) or k for c in chunks.split(",")]
    bad = [c for c in asked if ((c % CHUNK_ALIGN or not 0 < c <= k) if explore else c not in legal)]
    if bad:
        allowed = f"multiples of {CHUNK_ALIGN} up to {k}" if explore else f"legal: {legal}"
        raise SystemExit(f"partition_probe: --chunks {bad} not legal for n={n}, k={k}; {allowed}")
    return asked


def selector(dep: Deployment, n: int, k: int, chunk: int):
    """The detent selection of the site with `chunk` pinned (the other values the default tuple's knobs); None for a
    partition the program does not reach (`--explore`)."""
    if chunk not in legal_partitions(dep, n, k):
        return None
    key = site_key("matmul", {"n": n, "k": k})
    pinned = CommitmentTuple(sites={key: {"pins": {"chunk": chunk}, "knobs": {}}}, deployment=asdict(dep))
    return KernelSelections(dep, commitment=pinned).get("matmul", n=n, k=k)


def site_operands(dep: Deployment, n: int, k: int, has_bias: bool, chunk: int, max_m: int, g: torch.Generator,
                  device: str = "cuda") -> tuple:
    """(the selection with `chunk` pinned, w, its cold copies, the bias, max_m rows of x, `linear`'s rows under
    `chunk` and under K whole (the control)) of an n x k site (the probes of one partition; `g` on `device`)."""
    from detent_rl.timing import cold_copies
    select = selector(dep, n, k, chunk)
    w0 = (torch.randn(n, k, generator=g, device=device) / k ** 0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=g, device=device).to(torch.bfloat16) if has_bias else None
    big = torch.randn(max_m, k, generator=g, device=device).to(torch.bfloat16)
    ref_all = linear(big, w0, b, chunk=chunk, parallel=False, block_m=64, block_n=64, block_k=64)
    whole_all = linear(big, w0, b, chunk=k, parallel=False, block_m=64, block_n=64, block_k=64)
    return select, w0, cold_copies(w0), b, big, ref_all, whole_all


def baseline(x, w0, w, b, select, ref, us) -> tuple:
    """(cuBLAS's µs, the selection's launch parameters, its µs, whether its rows equal `ref`) at x's M."""
    cublas = us(lambda: torch.nn.functional.linear(x, w(), b))
    chosen = launch_params(select(x.shape[0]))
    return cublas, chosen, us(lambda: linear(x, w(), b, **chosen)), torch.equal(linear(x, w0, b, **chosen), ref)


def grid(m: int, n: int, k: int, chunk: int, sms: int, wgmma: bool) -> list[tuple[str, dict]]:
    """(name, `linear` keyword arguments) of every grid form tried at M = m for this partition."""
    cut = chunk < k
    forms = []
    for bm, bn, bk, warps, stages in (NARROW if m <= SMALL_M else MID if m <= 640 else []):
        if chunk % bk == 0:
            for parallel in ((True, False) if cut else (False,)):
                forms.append((f"{'P' if parallel else 'S'}{bm}x{bn}x{bk}w{warps}s{stages}",
                              dict(parallel=parallel, block_m=bm, block_n=bn, block_k=bk, num_warps=warps,
                                   num_stages=stages)))
    for bm, bn, bk, ring, swap, split, top in (WGMMA if wgmma else []):
        if m > top or chunk % bk or (split and not cut) or (swap and split):
            continue
        if not tile_fits(bm, bn, cut and not split, swap):
            continue
        units = -(-m // bm) * -(-n // bn) * (-(-k // chunk) if split else 1)
        for persistent in ((False, True) if units > sms else (False,)):
            name = f"{'swap' if swap else ''}w{'S' if split else ''}{bm}x{bn}x{bk}r{ring}{'P' if persistent else ''}"
            forms.append((name, dict(parallel=split, block_m=bm, block_n=bn, block_k=bk, num_stages=ring, wgmma=True,
                                     swap_ab=swap, persistent=persistent)))
    return forms


def describe(params: dict) -> str:
    form = ("P" if params["parallel"] else "S") + ("w" if params["wgmma"] else "")
    return (f"{form}{params['block_m']}x{params['block_n']}x{params['block_k']}"
            f"{'swap' if params['swap_ab'] else ''}{'P' if params['persistent'] else ''}")


RANGES = {"small": lambda m: m <= SMALL_M, "mid": lambda m: SMALL_M < m < LARGE_M, "large": lambda m: m >= LARGE_M}


def worst(rows: list[dict], key: str, span: str) -> float:
    """The largest ratio to cuBLAS among the rows in that span of M (`RANGES`: M <= 64, 64 < M < 512, M >= 512)."""
    picked = [r[key] / r["cublas"] for r in rows if RANGES[span](r["m"])]
    picked = [p for p in picked if p == p]  # (no `selected` for a partition the program does not reach: NaN)
    return max(picked) if picked else float("nan")


def summary(results: list[dict]) -> None:
    """Per partition, the worst ratio in each span of M, selected and best. Issue 10's goals are on the two ends; the
    middle (a GRPO batch's decode, 128-256 rows) is not a goal but must not be given up for them."""
    print("\n| model | site | chunk (chunks) | selected, worst at M <= 64 / 65-511 / >= 512 | best, worst at M <= 64 / "
          "65-511 / >= 512 | best meets both ends | bits | cuBLAS differs somewhere |")
    print("|---|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["model"], r["site"], r["chunk"], r["k"]), []).append(r)
    for (model, site, chunk, k), rows in groups.items():
        sel = " / ".join(f"{worst(rows, 'selected', span):.2f}x" for span in RANGES)
        best = {span: worst(rows, "best", span) for span in RANGES}
        meets = best["small"] <= GOALS[SMALL_M] and best["large"] <= GOALS[LARGE_M]  # (False where either is NaN)
        print(f"| {model} | {site} | {chunk} ({-(-k // chunk)}) | {sel} | "
              f"{' / '.join(f'{v:.2f}x' for v in best.values())} | {'yes' if meets else 'no'} | "
              f"{'=' if all(r['bits'] for r in rows) else 'DIFF'} | "
              f"{'yes' if any(not r['cublas_equal'] for r in rows) else 'NO (a weak check)'} |")


def plan(args, sms: int, smem: int) -> None:
    for model in args.models.split(","):
        dep = deployment(model, sms, smem)
        for name, n, k, _ in SITES[model]:
            if name not in args.sites.split(","):
                continue
            for chunk in partitions(dep, n, k, args.chunks, args.explore):
                select = selector(dep, n, k, chunk)
                cells = [f"{m}: {describe(launch_params(select(m))) if select else 'not selectable'} "
                         f"+{len(grid(m, n, k, chunk, sms, True))}" for m in args.ms]
                print(f"{model} {name} {k}->{n} chunk {chunk} ({-(-k // chunk)}): " + ", ".join(cells))


def probe(args, sms: int, smem: int, device: str) -> list[dict]:
    from detent_rl.kernels.matmul_wgmma import applies
    from detent_rl.timing import cold_copies, kernel_timer

    timer = kernel_timer(torch.device(device), 3)
    us = lambda fn: timer(fn) * 1e6  # noqa: E731
    start, results = time.monotonic(), list(args.done)
    done = {(r["model"], r["site"], r["chunk"], r["m"]) for r in results}
    where = (f"{torch.cuda.get_device_name()}; µs per call (CUDA-graph replays, cold weights)" if device == "cuda"
             else "CPU (--cpu: the script's logic, not figures); µs per call (median of 3)")
    print(f"# {where}, torch {torch.__version__}; best: the grid's fastest form")
    print("| model | site | chunk | M | cuBLAS | selected (ratio) | best (ratio) | bits | cuBLAS= |")
    print("|---|---|---|---|---|---|---|---|---|")
    g = torch.Generator(device=device).manual_seed(0)
    for model in args.models.split(","):
        dep = deployment(model, sms, smem)
        for name, n, k, has_bias in SITES[model]:
            if name not in args.sites.split(","):
                continue
            w0 = (torch.randn(n, k, generator=g, device=device) / k ** 0.5).to(torch.bfloat16)
            w = cold_copies(w0)
            b = torch.randn(n, generator=g, device=device).to(torch.bfloat16) if has_bias else None
            big = torch.randn(max(args.ms), k, generator=g, device=device).to(torch.bfloat16)
            for chunk in partitions(dep, n, k, args.chunks, args.explore):
                select = selector(dep, n, k, chunk)
                ref = linear(big, w0, b, chunk=chunk, parallel=False, block_m=64, block_n=64, block_k=64)
                for m in args.ms:
                    if (model, name, chunk, m) in done:
                        continue
                    if time.monotonic() - start > args.budget_s:
                        print(f"(--budget-s {args.budget_s} reached: {model} {name} chunk {chunk} from M = {m} on "
                              f"not timed)")
                        return results
                    x = big[:m]
                    cublas = us(lambda: torch.nn.functional.linear(x, w(), b))
                    chosen = launch_params(select(m)) if select else None
                    if chosen:
                        assert chosen.pop("chunk") == chunk, "the pin holds"
                    forms = [("selected " + describe(chosen), chosen)] if select else []
                    forms += grid(m, n, k, chunk, sms, applies(x, w0, 64))
                    times, same, errors = {}, True, []
                    for label, kw in forms:
                        try:
                            out = linear(x, w0, b, chunk=chunk, **kw)
                        except Exception as e:  # noqa: BLE001 - a probe reports a form that does not compile or fit
                            errors.append(f"{label}: {type(e).__name__}: {str(e)[:200]}")
                            continue
                        if not torch.equal(out, ref[:m]):
                            same = False
                            errors.append(f"{label}: {int((out != ref[:m]).sum())} of {out.numel()} outputs differ")
                        times[label] = us(lambda: linear(x, w(), b, chunk=chunk, **kw))
                    if not times:
                        print(f"| {model} | {name} | {chunk} | {m} | {cublas:.1f} | no form ran: {errors[:2]} |")
                        continue
                    label0 = forms[0][0] if select else "selected: not selectable"
                    selected = times.get(label0, float("nan"))
                    best_label = min(times, key=times.get)
                    cublas_equal = torch.equal(torch.nn.functional.linear(x, w0, b), ref[:m])
                    results.append(dict(model=model, site=name, n=n, k=k, chunk=chunk, m=m, cublas=cublas,
                                        selected=selected, selected_form=label0, best=times[best_label],
                                        best_form=best_label, bits=same, cublas_equal=cublas_equal,
                                        each=times))
                    print(f"| {model} | {name} | {chunk} | {m} | {cublas:.1f} | {selected:.1f} {label0[9:]} "
                          f"({selected / cublas:.2f}x) | {times[best_label]:.1f} {best_label} "
                          f"({times[best_label] / cublas:.2f}x) | {'=' if same else 'DIFF'} | "
                          f"{'=' if cublas_equal else 'differs'} |", flush=True)
                    for e in errors[:3]:
                        print("   ", e)
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument("--sites", default="down")
    ap.add_argument("--chunks", default="all", help="'all' (every legal partition) or a comma list, 0 = K whole")
    ap.add_argument("--ms", default=MS)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--explore", action="store_true", help="--chunks may name partitions the selection program "
                    "does not reach (any multiple of 128 up to K): timed in the grid only")
    ap.add_argument("--json", help="also write the rows here (with --resume's)")
    ap.add_argument("--resume", help="an earlier run's --json: its rows are kept and not timed again (a device call's "
                    "limit: carry the file to the next call)")
    ap.add_argument("--plan", action="store_true", help="print each partition's selection and grid size; time nothing")
    ap.add_argument("--cpu", action="store_true", help="run every step on the CPU, where each form is `linear`'s CPU "
                    "path: a check of the script, not a measurement")
    args = ap.parse_args(argv)
    args.ms = sorted(int(m) for m in args.ms.split(","))
    args.done = []
    if args.resume:
        try:
            with open(args.resume) as f:
                args.done = json.load(f)
            assert isinstance(args.done, list) and all({"model", "site", "chunk", "m"} <= set(r) for r in args.done)
        except (OSError, ValueError, AssertionError) as e:
            raise SystemExit(f"partition_probe: --resume {args.resume}: not an earlier run's --json rows ({e})")
    for model in args.models.split(","):
        if model not in MODELS:
            raise SystemExit(f"partition_probe: --models {model!r}: expected some of {sorted(MODELS)}")
        unknown = set(args.sites.split(",")) - {s[0] for s in SITES[model]}
        if unknown:
            raise SystemExit(f"partition_probe: --sites {sorted(unknown)} unknown; {model}'s: "
                             f"{[s[0] for s in SITES[model]]}")
    cuda = torch.cuda.is_available() and not args.cpu
    props = torch.cuda.get_device_properties(0) if cuda else None
    sms = props.multi_processor_count if cuda else Deployment.num_sms
    smem = props.shared_memory_per_block_optin if cuda else Deployment.smem_bytes
    if args.plan:
        plan(args, sms, smem)
        return
    if not cuda and not args.cpu:
        raise SystemExit("partition_probe: no CUDA device; --plan prints the plan without one (--cpu runs the "
                         "script's steps on the CPU)")
    results = probe(args, sms, smem, "cuda" if cuda else "cpu")
    summary(results)
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
