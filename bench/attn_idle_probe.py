"""What a fixed attention grid costs: a step's attention call with its own query tiles against the same call over
a grid padded to what one CUDA graph of every step of its size would launch (docs/BENCHMARKS.md, session 48's design
note for attention inside the pieces).

A graph fixes the launch grid at capture. The split count is fixed already (the deployment's context over the split
size, in the pinned arms); the query tiles are not: a step's tiles are sum(ceil(q_len / rows a tile)) over its
requests. A graph of T padded rows and up to B requests must launch ceil(T / rows a tile) + B tiles; the padding
tiles point at an idle request (no rows, position 0), whose programs load its span, find no keys and return. The
padding rows (past the step's tokens) belong to no request: only the combine reads them. This times both calls as
CUDA-graph replays (the kernel and its combine) on the Qwen2-0.5B built-in's heads at each arm's own selection, and
checks that the real rows' outputs are bit-equal between the two grids (the padding changes no real row's work).

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/attn_idle_probe.py \
        --commitment bench/tuned/h100_qwen2-0.5b_serve64_attention.json [--caps 64,256] [--max-context 784]
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from detent_rl.kernels.attention import attn_meta, paged_attention
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.rollout.step_graphs import step_sizes

# (cached, new) tokens of each request: the bench's eager steps (bench/eager_steps.py) and a prefill alone
SHAPES = {"mixed 47 x 1 + 256": [(300, 1)] * 47 + [(0, 256)],
          "serve 40 x 1 + 2 x 288": [(400, 1)] * 40 + [(0, 288)] * 2,
          "prefill 4 x 256": [(0, 256)] * 4,
          "grpo prefill 32 x 200 + 224 x 8": [(0, 200)] * 32 + [(192, 8)] * 224}


def padded_meta(meta, rows: int, padded_rows: int, cap: int, tiles: int):
    """`meta` of `rows` query rows over a grid of `tiles` tiles and `cap` request slots, `padded_rows` rows: the
    requests past the step's are idle (no rows, position 0), the tiles past its own point at the first idle one,
    and the padding rows sit at position 0 (only the combine reads them)."""
    B = meta.pos0.shape[0]
    assert B < cap and meta.tile_req.shape[0] <= tiles, (B, cap, meta.tile_req.shape[0], tiles)
    dev = meta.cu_q.device

    def grow(t, n, fill):
        out = torch.full((n,) + tuple(t.shape[1:]), fill, dtype=t.dtype, device=dev)
        out[:t.shape[0]] = t
        return out
    return dataclasses.replace(
        meta, cu_q=grow(meta.cu_q, cap + 1, rows), pos0=grow(meta.pos0, cap, 0),
        token_pos=grow(meta.token_pos, padded_rows, 0), block_table=grow(meta.block_table, cap, 0),
        tile_req=grow(meta.tile_req, tiles, B), tile_q0=grow(meta.tile_q0, tiles, rows), scratch={})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--commitment", default="bench/tuned/h100_qwen2-0.5b_serve64_attention.json")
    ap.add_argument("--caps", default="64,256", help="request slots a graph holds (max_num_seqs + 1 and more)")
    ap.add_argument("--max-context", type=int, default=784)
    ap.add_argument("--shapes", default="", help="first words of SHAPES to run (default: all)")
    args = ap.parse_args()
    from detent_rl.timing import graph_seconds
    if not torch.cuda.is_available():
        raise SystemExit("attn_idle_probe: it times CUDA-graph replays: it needs a GPU")
    caps = [int(c) for c in args.caps.split(",")]
    shapes = {n: s for n, s in SHAPES.items() if not args.shapes or n.split()[0] in args.shapes.split(",")}
    path = builtin_checkpoint(args.model)
    print("| arm | step | tiles x heads x splits (own) | rows (padded) | request slots | tiles (padded) | "
          "own grid, µs | padded grid, µs | ratio | real rows equal |")
    print("|---" * 10 + "|")
    for arm, commitment in (("stock", None), ("tuned", CommitmentTuple.load(args.commitment))):
        model = load_model(path, "stock" if arm == "stock" else "detent", device="cuda", dtype=torch.bfloat16,
                           commitment=commitment, max_context=args.max_context, max_batch=256, max_num_tokens=8192)
        attn = model.model.layers[0].self_attn
        page = model.page_size
        for name, shape in shapes.items():
            at, tables = 0, []
            for cached, new in shape:
                n = -(-(cached + new) // page)
                tables.append(list(range(at, at + n)))
                at += n
            width = max(len(t) for t in tables)
            table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
            k_cache, v_cache = model.allocate_kv_cache(at + 1)[0]
            k_cache.normal_()
            v_cache.normal_()
            q_lens, cached = [n for _, n in shape], [c for c, _ in shape]
            rows = sum(q_lens)
            sel = model.select_attention(len(shape), max(q_lens), rows, max(c + n for c, n in shape))
            block_m, pack = model.attention_tiling(sel)
            meta = attn_meta(q_lens, cached, table, block_m, pack, device="cuda")
            q = torch.randn(rows, attn.num_heads, attn.head_dim, dtype=torch.bfloat16, device="cuda")
            params = dict(scale=attn.scale, block_n=sel.block_n, split_size=sel.split_size,
                          num_splits=sel.num_splits, num_warps=sel.num_warps, num_stages=sel.num_stages,
                          prefetch=sel.kv_prefetch, tree_sum=arm == "stock" and sel.block_n == 128)
            out = torch.empty_like(q)
            own = graph_seconds(lambda: paged_attention(q, k_cache, v_cache, meta, out=out, **params)) * 1e6
            grid_heads = attn.num_heads if pack == 1 else k_cache.shape[2]
            own_tiles = meta.tile_req.shape[0]
            padded_rows = next(b for b in step_sizes(8192) if b >= rows)
            per = block_m // pack
            for cap in caps:
                if cap <= len(shape):
                    continue
                tiles = -(-padded_rows // per) + min(cap, padded_rows)
                pmeta = padded_meta(meta, rows, padded_rows, cap, tiles)
                pq = torch.zeros(padded_rows, attn.num_heads, attn.head_dim, dtype=torch.bfloat16, device="cuda")
                pq[:rows] = q
                pout = torch.zeros_like(pq)
                padded = graph_seconds(lambda: paged_attention(pq, k_cache, v_cache, pmeta, out=pout, **params)) * 1e6
                paged_attention(q, k_cache, v_cache, meta, out=out, **params)
                paged_attention(pq, k_cache, v_cache, pmeta, out=pout, **params)
                equal = torch.equal(out, pout[:rows])
                print(f"| {arm} | {name} | {own_tiles} x {grid_heads} x {sel.num_splits} (block_m {block_m}, pack "
                      f"{pack}) | {rows} ({padded_rows}) | {cap} | {tiles} | {own:.1f} | {padded:.1f} | "
                      f"{padded / own:.2f}x | {equal} |", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
