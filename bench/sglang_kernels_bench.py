"""SGLang's own Triton kernels (SGLang 0.5.23) under each arm's selection, side by side: stock,
SGLang's deterministic mode, and the DETENT plugin's pins.

    python3 -P bench/sglang_kernels_bench.py [--family decode,extend,moe] [--heads 32,8,128]
        [--cases 1x4000,8x2000,64x2000,256x1000,2x12000] [--tiles 256,512,1024] [--context 16384]
        [--extend-cases 1x4000,8x1000,32x512] [--moe-tokens 1,8,64,512,2048,8192] [--moe-rows 1,512]

decode: the split selection and `decode_attention_fwd` under SGLang's stock heuristic, its
deterministic mode's fixed 256-key tile, and the plugin's pinned tiles (`--tiles`, the tuple's
`split_tile_size`).

Each step is the split counts plus the attention, timed (as every family's) as CUDA-graph replays
(triton.testing.do_bench_cudagraph), µs. `bits`: request 0's output row decoded alone and inside the
case's batch, equal (`=`) or not. Lengths: each case's batch of `n x L` has lengths spread ±10 %
around L (a GRPO group's completions), request 0 at L.

extend: one prefill step of `n x L` prompts (the same ±10 % spread) by the two-stage stock kernel and
the one-stage kernel that deterministic mode and the plugin run (tests/sglang_kernel_cases.py), µs for
the step without a cached prefix and for the second chunk after half of each prompt is cached; bits:
prompt 0's rows alone = in the batch, and in one chunk = in two (half cached).

moe: the up projection of Qwen3-30B-A3B-class experts (E 128, top 8, hidden 2,048, intermediate 768)
by `invoke_fused_moe_kernel`, for M tokens, under the config SGLang picks for M (stock), its
deterministic mode's default, the plugin's committed row with no tuple (the solver's default), and
the row SGLang picks at `--moe-rows` M (what a tuple pinning that row commits); bits: token 0's rows
computed alone = inside the M tokens. The kernel alone is timed (the expert alignment, the same for
every arm, is computed beforehand).

Needs SGLang's package (tests/sglang_env.py; on the device, the wheels `bench/sglang_wheels.sh` fetches).
"""
from __future__ import annotations

import argparse
import os
import random
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from sglang_env import import_sglang  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="decode,extend,moe", help="comma-separated, of decode, extend, moe")
    ap.add_argument("--extend-cases", default="1x4000,8x1000,32x512")
    ap.add_argument("--moe-tokens", default="1,8,64,512,2048,8192")
    ap.add_argument("--moe-rows", default="1,512", help="the detent arms' pinned rows, as the M SGLang picks them at")
    ap.add_argument("--heads", default="32,8,128", help="query heads, KV heads, head dim")
    ap.add_argument("--cases", default="1x4000,8x2000,64x2000,256x1000,2x12000")
    ap.add_argument("--tiles", default="256,512,1024", help="the DETENT arm's split tiles")
    ap.add_argument("--context", type=int, default=16384, help="the deployment's context (split buffers)")
    args = ap.parse_args()
    import_sglang()
    families = args.family.split(",")
    unknown = sorted(set(families) - {"decode", "extend", "moe"})
    if unknown:
        ap.error(f"--family {unknown}: known are decode, extend, moe")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"sglang {__import__('sglang').__version__}")
    if "decode" in families:
        decode(args)
    if "extend" in families:
        extend(args)
    if "moe" in families:
        moe(args)


def spread(n: int, length: int) -> list[int]:
    """n lengths: the first `length`, the others within ±10 % of it (a GRPO group's)."""
    rng = random.Random(0)
    return [length] + [max(1, round(length * rng.uniform(0.9, 1.1))) for _ in range(n - 1)]


def decode(args) -> None:
    from sglang_decode_cases import Batch, backend
    heads, kv_heads, dim = (int(v) for v in args.heads.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    arms = [("stock", 0), ("deterministic", 256)] + [("detent", int(t)) for t in args.tiles.split(",")]
    print(f"\n## decode attention; heads {heads}/{kv_heads} x {dim}, bf16; us per step")
    names = [a if a != "detent" else f"detent {t}" for a, t in arms]
    print("| case | " + " | ".join(names) + " | bits (alone = in batch) |")
    print("|---|" + "---|" * (len(arms) + 1))
    for case in args.cases.split(","):
        n, length = (int(v) for v in case.split("x"))
        lens = spread(n, length)
        batch = Batch(lens, num_head=heads, num_kv_head=kv_heads, dim=dim, dtype=torch.bfloat16, device="cuda")
        times, bits = [], []
        for arm, tile in arms:
            be, select = backend(arm, num_head=heads, num_kv_head=kv_heads, context=args.context, sms=sms, tile=tile)
            run = batch.step(batch.inputs(list(range(n)), be), be, select)
            times.append(triton.testing.do_bench_cudagraph(run, rep=20) * 1e3)
            alone, _ = batch.row(0, [0], be, select)
            inside, _ = batch.row(0, list(range(n)), be, select)
            bits.append("=" if torch.equal(alone, inside) else "≠")
        cells = [f"{times[0]:.1f}"] + [f"{t:.1f} ({t / times[0]:.2f}x)" for t in times[1:]]
        print(f"| {case} | " + " | ".join(cells) + " | " + " ".join(bits) + " |", flush=True)


def extend(args) -> None:
    from sglang_kernel_cases import EXTEND_ARMS, Prompts
    heads, kv_heads, dim = (int(v) for v in args.heads.split(","))
    print(f"\n## extend attention; heads {heads}/{kv_heads} x {dim}, bf16; us per step")
    print("| case | " + " | ".join(f"{a}: no prefix / half cached" for a in EXTEND_ARMS)
          + " | " + " | ".join(f"bits {a}: alone = in batch, one chunk = two" for a in EXTEND_ARMS) + " |")
    print("|---|" + "---|" * 2 * len(EXTEND_ARMS))
    for case in args.extend_cases.split(","):
        n, length = (int(v) for v in case.split("x"))
        lens = spread(n, length)
        p = Prompts(lens, num_head=heads, num_kv_head=kv_heads, dim=dim, dtype=torch.bfloat16, device="cuda")
        whole = [(i, 0, n_i) for i, n_i in enumerate(lens)]
        second = [(i, n_i // 2, n_i - n_i // 2) for i, n_i in enumerate(lens)]
        times, bits = [], []
        for arm in EXTEND_ARMS:
            times.append([triton.testing.do_bench_cudagraph(p.extend(arm, step)[0], rep=20) * 1e3
                          for step in (whole, second)])
            alone = p.rows(arm, 0, [[whole[0]]])
            inside = p.rows(arm, 0, [whole])
            two = p.rows(arm, 0, [[(0, 0, lens[0] // 2)], second])
            bits.append(("=" if torch.equal(alone, inside) else "≠") + " " + ("=" if torch.equal(alone, two) else "≠"))
        cells = [f"{a:.1f} / {b:.1f}" for a, b in times]
        print(f"| {case} | " + " | ".join(cells) + " | " + " | ".join(bits) + " |", flush=True)


def moe(args) -> None:
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F
    from sglang_kernel_cases import moe_config, moe_up
    E, top_k, hidden, inter = 128, 8, 2048, 768
    w1_shape, w2_shape = (E, 2 * inter, hidden), (E, hidden, inter)
    g = torch.Generator(device="cpu").manual_seed(0)
    w1 = (torch.randn(w1_shape, generator=g) * hidden ** -0.5).to(torch.bfloat16).cuda()
    tokens = [int(v) for v in args.moe_tokens.split(",")]
    x = torch.randn(max(tokens), hidden, generator=g).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(max(tokens))]).to(torch.int32).cuda()
    weights = torch.rand(max(tokens), top_k, generator=g).cuda()
    rows = [int(v) for v in args.moe_rows.split(",")]
    arms = [("stock", None), ("deterministic", None), ("detent", None)] + [("stock", r) for r in rows]
    names = ["stock", "deterministic", "detent (no tuple)"] + [f"detent (row of M={r})" for r in rows]
    print(f"\n## fused MoE up projection; E {E}, top {top_k}, {hidden} -> 2 x {inter}, bf16; us per call "
          f"(device {F.get_device_name()})")
    print("| tokens | " + " | ".join(names) + " | bits (token 0 alone = in the batch) |")
    print("|---|" + "---|" * (len(arms) + 1))
    for m in tokens:
        times, bits = [], []
        for arm, row in arms:
            config = moe_config(arm, w1_shape, w2_shape, top_k, m if row is None else row)
            run, out = moe_up(x[:m], w1, ids[:m], weights[:m], config)
            times.append(triton.testing.do_bench_cudagraph(run, rep=20) * 1e3)
            run()
            first = moe_config(arm, w1_shape, w2_shape, top_k, 1 if row is None else row)
            alone_run, alone = moe_up(x[:1], w1, ids[:1], weights[:1], first)
            alone_run()
            bits.append("=" if torch.equal(alone[0], out[0]) else "≠")
        cells = [f"{times[0]:.1f}"] + [f"{t:.1f} ({t / times[0]:.2f}x)" for t in times[1:]]
        print(f"| {m} | " + " | ".join(cells) + " | " + " ".join(bits) + " |", flush=True)


if __name__ == "__main__":
    main()
