"""The attention combine's schedules: time per launch against the plain loop, or the bench's cases with one of them.

`_combine_kernel` (kernels/attention_combine.py) loads `COMBINE_UNROLL` splits a trip on `COMBINE_WARPS` warps; the
plain loop it replaced (one split's loads, then its sums) is `tests/combine_cases.py`'s `ordered_combine`, which takes
the same arguments. Every schedule adds the splits in the same order, so every one must write the plain loop's bits: the
per-launch table says whether each did, beside its time (CUDA-graph replays: `detent_rl.timing.graph_seconds`).

    python bench/combine_bench.py                                   # per launch: plain, then each schedule (GPU)
    python bench/combine_bench.py --schedules u4w1,u2w1,u8w1
    python bench/combine_bench.py --engine plain -- --arms stock,detent --cases decode-32,grpo --out runs/c_plain
    python bench/combine_bench.py --engine u4w4 -- --arms stock,detent --cases decode-32,grpo --out runs/c_u4w4
    python bench/combine_bench.py --engine plain --script bench/decode_profile.py -- --batch 32 --pdl on,off

`--engine` runs `python -m detent_rl.bench` (or `--script`, another bench script; the arguments after `--` are
its) with the engine's combine swapped: `plain` (the loop above), `uUwW` (U splits a trip, W warps, one program a
(row, head): `_combine_kernel`) or `hUwW` (a row's heads in one program: `_combine_heads_kernel`), for every launch;
`--heads-from R` keeps both, the row kernel from R rows (the engine's rule, `COMBINE_HEADS_FROM`). Run it once per
schedule, each run with the stock arm beside (docs/BENCHMARKS.md, sessions 42 and 46).

    python bench/combine_bench.py --engine u4w1 --heads-from 256 -- --arms stock,detent --cases grpo --out runs/c
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

SHAPES = ((1, 14, 2), (32, 14, 2), (256, 14, 2), (256, 14, 3), (64, 14, 3), (2048, 14, 2), (8192, 14, 4),
          (1, 12, 48), (2, 12, 47), (256, 12, 24), (8192, 12, 24))
# (rows, heads, splits a row): decode of the 0.5B, prefills, a 12,000-token context's decode and its prompt's chunks


def parse_schedule(text: str) -> tuple[str, int, int]:
    """"u4w1" -> ("u", 4 splits a trip, 1 warp): one program a (row, head); "h4w4": a row's heads in one program."""
    try:
        u, w = text[1:].split("w")
        assert text[0] in "uh" and int(u) > 0 and int(w) in (1, 2, 4, 8)
        return text[0], int(u), int(w)
    except (AssertionError, ValueError, IndexError):
        raise SystemExit(f"combine_bench: schedule {text!r}: expected uUwW or hUwW, e.g. u4w1 (U splits a trip, W "
                         f"warps of 1, 2, 4 or 8; h: a row's heads in one program)") from None


def per_launch(schedules: list[tuple[int, int]], head_dim: int = 64, split_len: int = 256) -> None:
    from combine_cases import ordered_combine

    from detent_rl.kernels._triton import triton
    from detent_rl.kernels.attention_combine import _combine_heads_kernel, _combine_kernel
    from detent_rl.timing import graph_seconds
    print("| rows x heads, splits | plain | " + " | ".join(f"{'a row' if k == 'h' else 'a (row, head)'}: {u} a trip, "
                                                        f"{w} warp(s)" for k, u, w in schedules) + " | bits equal |")
    print("|---" * (len(schedules) + 3) + "|")
    for rows, heads, n in SHAPES:
        m = torch.randn(rows, heads, n, device="cuda") * 4
        lsum = torch.rand(rows, heads, n, device="cuda") + 1
        o = torch.randn(rows, heads, n, head_dim, device="cuda")
        pos = torch.full((rows,), (n - 1) * split_len + 5, dtype=torch.int32, device="cuda")
        out = torch.empty(rows, heads, head_dim, dtype=torch.bfloat16, device="cuda")
        args = (m, lsum, o, out, pos, m, m.stride(0), m.stride(1), o.stride(0), o.stride(1), o.stride(2),
                out.stride(0), out.stride(1), 0, split_len)
        times, outs = [], []
        for kind, u, w in [("plain", 1, 4)] + schedules:
            def fn(kind=kind, u=u, w=w):
                if kind == "h":
                    _combine_heads_kernel[(rows,)](*args, heads, HEAD_DIM=head_dim,
                                                   HEADS_P2=triton.next_power_of_2(heads), UNROLL=u, LSE=False,
                                                   PDL=False, num_warps=w)
                else:
                    kernel = ordered_combine if kind == "plain" else _combine_kernel
                    kernel[(rows, heads)](*args, HEAD_DIM=head_dim, UNROLL=u, LSE=False, PDL=False, num_warps=w)
            fn()  # compiled before the capture
            times.append(graph_seconds(fn) * 1e6)
            outs.append(out.clone())
        same = all(torch.equal(outs[0], x) for x in outs[1:])
        print(f"| {rows:,} x {heads}, {n} | " + " | ".join(f"{t:.2f}" for t in times) + f" | {same} |", flush=True)


def engine(schedule: str, bench_args: list[str], script: str | None = None, heads_from: int | None = None
           ) -> int:
    import detent_rl.kernels.attention_combine as combine
    if schedule == "plain":
        from combine_cases import ordered_combine
        combine._combine_kernel, combine.COMBINE_WARPS = ordered_combine, 4
        combine.COMBINE_HEADS_FROM = 1 << 62  # every launch the (row, head) kernel's
    else:
        kind, unroll, warps = parse_schedule(schedule)
        if kind == "h":  # every launch one program a row
            combine.COMBINE_HEADS_FROM, combine.COMBINE_HEADS_UNROLL, combine.COMBINE_HEADS_WARPS = 0, unroll, warps
        else:
            combine.COMBINE_HEADS_FROM, combine.COMBINE_UNROLL, combine.COMBINE_WARPS = 1 << 62, unroll, warps
    if heads_from is not None:  # both kernels, the row kernel from this many rows
        combine.COMBINE_HEADS_FROM = heads_from
    trip = "one split a trip" if schedule == "plain" else f"{combine.COMBINE_UNROLL} splits a trip"
    each = f"{combine._combine_kernel.fn.__name__}, {trip}, {combine.COMBINE_WARPS} warps"
    rows = f"_combine_heads_kernel, {combine.COMBINE_HEADS_UNROLL} splits a trip, {combine.COMBINE_HEADS_WARPS} warps"
    start = combine.COMBINE_HEADS_FROM
    print(f"combine: {schedule} (" + (each if start >= 1 << 62 else rows if start == 0 else
                                     f"{each}; from {start:,} rows {rows}") + ")", flush=True)
    if script is not None:  # the script as `python script args` would run it, in this process
        import runpy
        sys.argv = [script, *bench_args]
        runpy.run_path(script, run_name="__main__")
        return 0
    from detent_rl.bench import main
    return main(bench_args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rest = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedules", default="u4w1,u2w1,h4w4,h2w4,h4w8,h2w2",
                    help="per launch: the schedules timed beside the plain loop (uUwW, comma-separated)")
    ap.add_argument("--engine", help="plain, uUwW or hUwW: run the bench (the arguments after --) with this combine")
    ap.add_argument("--script", help="--engine: run this bench script instead of python -m detent_rl.bench")
    ap.add_argument("--heads-from", type=int, help="--engine: the one-program-a-row kernel from this many rows "
                    "(the schedule's kernel below)")
    args = ap.parse_args(argv)
    if args.engine is not None:  # (`engine` parses the schedule before it swaps anything)
        if args.script is not None and not os.path.isfile(args.script):
            raise SystemExit(f"combine_bench: --script {args.script}: no such file")
        return engine(args.engine, rest, args.script, args.heads_from)
    if rest:
        raise SystemExit(f"combine_bench: arguments after -- ({' '.join(rest)}) are the bench's: they need --engine")
    schedules = [parse_schedule(s) for s in args.schedules.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("combine_bench: the per-launch table times CUDA graphs: it needs a GPU")
    per_launch(schedules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
