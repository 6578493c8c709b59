"""Our paged split-KV attention vs PyTorch SDPA (flash, contiguous KV), side by side on the GPU.

Command: python bench/kernels_attention_bench.py
(`bits`: our kernel with and without its KV prefetch, equal.)
Qwen2-0.5B-class heads (14 q, 2 kv, head dim 64), bf16, 16-token pages. Decode: B requests of one
query each over `ctx` cached keys; prefill: one request of `ctx` queries. Our kernel runs with the
pinned tiles of the detent default tuple (64x64) and the split size shown; SDPA gets the same
problem with contiguous, GQA-expanded K/V (what a stock engine's flash kernel sees). Times are
CUDA-graph replays (triton.testing.do_bench_cudagraph), i.e. without Python launch overhead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from detent_rl.kernels.attention import attn_meta, paged_attention

H, KVH, D, PAGE = 14, 2, 64, 16


def _case(batch: int, ctx: int, q_len: int, split: int):
    pages = -(-ctx // PAGE)
    k_cache = torch.randn(batch * pages, PAGE, KVH, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    table = torch.arange(batch * pages, device="cuda", dtype=torch.int32).view(batch, pages)
    q = torch.randn(batch * q_len, H, D, device="cuda", dtype=torch.bfloat16)
    meta = attn_meta([q_len] * batch, [ctx - q_len] * batch, table, 64)
    ns = -(-4096 // split)
    ours = lambda prefetch=True: paged_attention(q, k_cache, v_cache, meta, scale=D ** -0.5,  # noqa: E731
                                                 block_n=64, split_size=split, num_splits=ns, num_warps=4,
                                                 prefetch=prefetch)
    k = k_cache.view(batch, pages * PAGE, KVH, D)[:, :ctx].repeat_interleave(H // KVH, 2).transpose(1, 2)
    v = v_cache.view(batch, pages * PAGE, KVH, D)[:, :ctx].repeat_interleave(H // KVH, 2).transpose(1, 2)
    qs = q.view(batch, q_len, H, D).transpose(1, 2)
    mask = None
    if q_len > 1:
        mask = torch.ones(q_len, ctx, dtype=torch.bool, device="cuda").tril(ctx - q_len)
    sdpa = lambda: F.scaled_dot_product_attention(qs, k, v, attn_mask=mask)  # noqa: E731
    return ours, sdpa


def main() -> None:
    print(f"# GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| phase | batch | ctx | split | ours us | ours, no KV prefetch, us | SDPA us | ours/SDPA | bits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for phase, batch, ctx, q_len in (("decode", 1, 1024, 1), ("decode", 32, 1024, 1), ("decode", 128, 1024, 1),
                                     ("decode", 1, 4096, 1), ("decode", 32, 4096, 1),
                                     ("prefill", 1, 512, 512), ("prefill", 1, 2048, 2048), ("prefill", 4, 1024, 1024)):
        for split in (512, 4096):
            ours, sdpa = _case(batch, ctx, q_len, split)
            t_ours = triton.testing.do_bench_cudagraph(ours, rep=50)
            t_plain = triton.testing.do_bench_cudagraph(lambda: ours(False), rep=50)
            t_sdpa = triton.testing.do_bench_cudagraph(sdpa, rep=50)
            same = "=" if torch.equal(ours(), ours(False)) else "DIFF"
            print(f"| {phase} | {batch} | {ctx} | {split} | {t_ours * 1e3:.1f} | {t_plain * 1e3:.1f} | "
                  f"{t_sdpa * 1e3:.1f} | {t_ours / t_sdpa:.2f} | {same} |")


if __name__ == "__main__":
    main()
