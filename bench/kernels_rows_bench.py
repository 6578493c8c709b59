"""Row-wise Triton kernels (detent selection) vs their stock PyTorch equivalents, side by side.

Run on a CUDA machine from the repository root:

    python bench/kernels_rows_bench.py [--dtype bf16|fp32] [--rows 1,32,256,2048] [--graphs]

Prints one markdown table: per op and row count, the median time of the Triton kernel with the
detent-pinned parameters, of the PyTorch equivalent (F.rms_norm where torch has it, else the HF
formula; torch.log_softmax; for the sampled token and its logprob, log_softmax, then argmax or an
exponential race; F.silu * up; HF rotate_half; F.embedding; for the fused rotary + k/v cache store,
our rotary then store_kv's index_put), and their ratio
(> 1: Triton is slower). Times come from `triton.testing.do_bench` (CUDA events, L2 flushed), or with
`--graphs` from `do_bench_cudagraph` (replays of a captured graph: the kernels' time without the host's).
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch
import torch.nn.functional as F
import triton.testing

from detent_rl.kernels.kv_store import store_kv
from detent_rl.kernels.embedding import embedding
from detent_rl.kernels.log_softmax import log_softmax, token_logprobs
from detent_rl.kernels.rmsnorm import rmsnorm, rmsnorm_ref
from detent_rl.kernels.rotary import apply_rotary, apply_rotary_ref, rope_cos_sin, rotary_store
from detent_rl.kernels.sampling import sample_unfiltered
from detent_rl.kernels.programs.rows import elementwise_program
from detent_rl.kernels.programs.rows import log_softmax_program
from detent_rl.kernels.programs.rows import rmsnorm_program
from detent_rl.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref
from detent_rl.selir.cache import JITCache
from detent_rl.selir.solver import solve

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MAX_ROWS = 8192
# Qwen2-0.5B-class shapes (hidden 896, 14 query / 2 kv heads of 64, MLP 4864), plus hidden 4096
HIDDENS = (896, 4096)
VOCAB = 151936
HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64
INTERMEDIATE = 4864


def _detent(program, **facts):
    return solve(program, dict(facts, max_rows=MAX_ROWS), cache=JITCache(enabled=False)).commit()


def _torch_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return rmsnorm_ref(x, w, eps)


def _stock_sample(logits: torch.Tensor, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A stock engine's sampled token and its logprob: log-softmax at T, then argmax (greedy) or an
    exponential race over the probabilities (vLLM's and SGLang's draw)."""
    lp = torch.log_softmax(logits.float() / (t or 1.0), dim=-1)
    token = lp.argmax(-1) if t == 0 else (lp.exp() / torch.empty_like(lp).exponential_()).argmax(-1)
    return token, lp.gather(1, token[:, None])


def _ms(fn: Callable[[], object], graphs: bool = False) -> float:
    if graphs:  # replayed from a CUDA graph, as the engine's decode step runs them: no host time per call
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def cases(rows: int, dtype: torch.dtype) -> list[tuple[str, Callable, Callable]]:
    """(label, triton call, torch call) for every op at this row count."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for hidden in HIDDENS:
        cfg = _detent(rmsnorm_program, hidden=hidden)(rows)
        x = torch.randn(rows, hidden, device=dev, generator=g).to(dtype)
        r = torch.randn(rows, hidden, device=dev, generator=g).to(dtype)
        w = torch.randn(hidden, device=dev, generator=g).to(dtype)
        out.append((f"rmsnorm h={hidden}",
                    lambda x=x, w=w, c=cfg: rmsnorm(x, w, 1e-6, block=c.block, num_warps=c.num_warps),
                    lambda x=x, w=w: _torch_rms_norm(x, w, 1e-6)))
        out.append((f"add+rmsnorm h={hidden}",
                    lambda x=x, w=w, r=r, c=cfg: rmsnorm(x, w, 1e-6, block=c.block, num_warps=c.num_warps, residual=r),
                    lambda x=x, w=w, r=r: (_torch_rms_norm(r + x, w, 1e-6), r + x)))
    cfg = _detent(log_softmax_program, vocab=VOCAB)(rows)
    logits = torch.randn(rows, VOCAB, device=dev, generator=g).to(dtype)
    ids = torch.randint(0, VOCAB, (rows,), device=dev, generator=g)
    out.append((f"log_softmax V={VOCAB}",
                lambda c=cfg: log_softmax(logits, block=c.block, num_warps=c.num_warps),
                lambda: torch.log_softmax(logits.float(), dim=-1)))
    out.append((f"token_logprobs V={VOCAB}",
                lambda c=cfg: token_logprobs(logits, ids, block=c.block, num_warps=c.num_warps),
                lambda: torch.log_softmax(logits.float(), dim=-1).gather(1, ids[:, None])))
    seeds = torch.randint(0, 1 << 62, (rows,), device=dev, generator=g)
    positions = torch.randint(0, 4096, (rows,), device=dev, generator=g)
    for t in (0.0, 1.0, 0.7):  # greedy rows draw no noise; T = 1 divides by nothing; 0.7: the whole path
        temps = torch.full((rows,), t, device=dev)
        out.append((f"sample T={t:g} + logprob V={VOCAB}",
                    lambda c=cfg, temps=temps, t=t: sample_unfiltered(logits, seeds, positions, temps,
                                                                      temperature=t or 1.0, block=c.block,
                                                                      num_warps=c.num_warps),
                    lambda t=t: _stock_sample(logits, t)))
    blk = _detent(elementwise_program, width=INTERMEDIATE)(rows).block
    gate_up = torch.randn(rows, 2 * INTERMEDIATE, device=dev, generator=g).to(dtype)
    out.append((f"silu_and_mul d={INTERMEDIATE}", lambda: silu_and_mul(gate_up, block=blk),
                lambda: silu_and_mul_ref(gate_up)))
    from transformers import Qwen2Config
    rope_cfg = Qwen2Config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    cos, sin = rope_cos_sin(rope_cfg, 32768, dev, dtype)
    q = torch.randn(rows, HEADS, HEAD_DIM, device=dev, generator=g).to(dtype)
    k = torch.randn(rows, KV_HEADS, HEAD_DIM, device=dev, generator=g).to(dtype)
    pos = torch.randint(0, 32768, (rows,), device=dev, generator=g)
    blk = _detent(elementwise_program, width=HEADS * HEAD_DIM)(rows).block
    out.append((f"rotary {HEADS}+{KV_HEADS}x{HEAD_DIM}", lambda: apply_rotary(q, k, pos, cos, sin, block=blk),
                lambda: apply_rotary_ref(q, k, pos, cos, sin)))
    # the decode step's fused rotary + k/v cache store, against our two rotary launches + store_kv's index_put
    v = torch.randn_like(k)
    k_cache = torch.zeros(rows // 16 + 1, 16, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(k_cache.shape[0] * 16, device=dev, generator=g)[:rows]
    out.append((f"rotary+kv store {HEADS}+{KV_HEADS}x{HEAD_DIM}",
                lambda: rotary_store(q, k, v, pos, cos, sin, k_cache, v_cache, slots, block=blk),
                lambda: store_kv(*apply_rotary(q, k, pos, cos, sin, block=blk)[1:], v, k_cache, v_cache, slots)))
    weight = torch.randn(VOCAB, HIDDENS[0], device=dev, generator=g).to(dtype)
    blk = _detent(elementwise_program, width=HIDDENS[0])(rows).block
    out.append((f"embedding h={HIDDENS[0]}", lambda: embedding(ids, weight, block=blk),
                lambda: F.embedding(ids, weight)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--rows", default="1,32,256,2048")
    ap.add_argument("--graphs", action="store_true", help="time CUDA-graph replays of both sides (without it, "
                                                          "small row counts time the host's launch path)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA device"
    dtype = DTYPES[args.dtype]
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | {args.dtype}"
          + (" | CUDA-graph replays" if args.graphs else "") + "\n")
    print("| op | rows | triton (us) | torch (us) | triton / torch |")
    print("|---|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        for label, ours, stock in cases(rows, dtype):
            t_ours, t_stock = _ms(ours, args.graphs) * 1e3, _ms(stock, args.graphs) * 1e3
            print(f"| {label} | {rows} | {t_ours:.1f} | {t_stock:.1f} | {t_ours / t_stock:.2f} |", flush=True)


if __name__ == "__main__":
    main()
