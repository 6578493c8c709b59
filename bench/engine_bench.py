"""Engine decode throughput per arm, against the honest stock arm and HF `generate`, side by side in one run.

Run on a CUDA machine from the repository root:

    python bench/engine_bench.py [--model qwen2-0.5b|PATH] [--batch 32] [--prompt-len 128] [--new-tokens 256]

The model is a checkpoint directory, or a built-in config name whose random weights transformers
initializes and `save_pretrained` writes to a temporary directory; both sides load that directory
in bf16. Every request decodes exactly --new-tokens tokens greedily (no stop token), so both sides
do the same work. HF runs `model.generate` (batch of equal-length prompts, no padding, its default
dynamic cache, eager); the engine runs `Engine.generate` with CUDA-graph decode in the stock arm
(cuBLAS linears, the stock attention selection fixed at capture per padded batch: what a fast
non-invariant engine does, and the baseline every ratio is taken against), the detent arm and the
det arm. Each arm is warmed up once, then timed over --repeats runs (median). Prints a markdown
table: wall time, output tokens/s, ms per decode step (wall / new tokens), the time relative to
stock and the speed-up over HF. The engine's greedy tokens are also compared with
HF's (they need not agree bit for bit — different kernels — only mostly).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from detent_rl.models import load_model
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams

CONFIGS = {  # Qwen2-0.5B's published architecture
    "qwen2-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True),
}


def checkpoint(name: str, root: Path) -> Path:
    if name not in CONFIGS:
        path = Path(name)
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {name}: neither a built-in config {sorted(CONFIGS)} nor a checkpoint directory")
        return path
    import transformers
    cfg = dict(CONFIGS[name])
    cls = {"qwen2": "Qwen2"}[cfg.pop("model_type")]
    config = getattr(transformers, f"{cls}Config")(**cfg)
    torch.manual_seed(0)
    model = getattr(transformers, f"{cls}ForCausalLM")(config).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / name)
    return root / name


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up: compiles kernels, captures graphs
    times, out = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def profile(fn) -> None:
    import cProfile
    import pstats
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prof.enable()
    fn()
    torch.cuda.synchronize()
    prof.disable()
    wall = time.perf_counter() - t0
    print(f"\nhost profile of one run ({wall:.2f} s wall):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    gpu_us = sum(e.device_time_total for e in p.key_averages())
    print(f"GPU kernel time of one run: {gpu_us / 1e6:.2f} s")
    print(p.key_averages().table(sort_by="device_time_total", row_limit=15))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also print the host-side cProfile of one detent "
                                                             "CUDA-graph run and its GPU kernel time")
    args = ap.parse_args()
    import transformers
    transformers.logging.set_verbosity_error()

    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint(args.model, Path(tmp))
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
        vocab = hf.config.vocab_size
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=g)
        n = args.new_tokens
        limits = dict(max_context=args.prompt_len + n + 16, max_batch=max(args.batch, 8),
                      max_num_tokens=max(args.batch * args.prompt_len, 2048))

        def run_hf():
            with torch.inference_mode():
                return hf.generate(prompts.cuda(), attention_mask=torch.ones_like(prompts).cuda(), do_sample=False,
                                   max_new_tokens=n, min_new_tokens=n, pad_token_id=0)[:, args.prompt_len:].tolist()

        rows = []
        hf_s, hf_tokens = timed(run_hf, args.repeats)
        rows.append(("HF generate (eager, dynamic cache)", hf_s, None))
        hf = None  # free its memory before the engine arms load
        torch.cuda.empty_cache()
        params = [SamplingParams(seed=i, temperature=0.0, max_tokens=n) for i in range(args.batch)]
        pages = -(-limits["max_context"] // 16) * args.batch + 8
        for label, arm, graphs in (("engine, stock (cuBLAS), CUDA graphs", "stock", True),
                                   ("engine, detent, CUDA graphs", "detent", True),
                                   ("engine, det, CUDA graphs", "det", True)):
            model = load_model(path, arm, device="cuda", dtype=torch.bfloat16, **limits)
            engine = Engine(model, num_blocks=pages, max_num_seqs=args.batch, cuda_graphs=graphs)

            def run_engine(engine=engine):
                engine.flush_cache()  # every run prefills its prompts
                return [s.completion for s in engine.generate(prompts.tolist(), params)]

            s, tokens = timed(run_engine, args.repeats)
            if args.profile and graphs and arm == "detent":
                profile(run_engine)
            same = sum(a == b for x, y in zip(tokens, hf_tokens) for a, b in zip(x, y)) / (args.batch * n)
            rows.append((label, s, same))
            del engine, model
            torch.cuda.empty_cache()

    total = args.batch * n
    print(f"model {args.model}, bf16, batch {args.batch}, prompt {args.prompt_len}, {n} new tokens each, "
          f"median of {args.repeats}, {torch.cuda.get_device_name()}\n")
    stock_s = rows[1][1]
    print("| arm | wall s | output tok/s | ms / decode step | time vs stock | speed-up vs HF | "
          "greedy tokens equal to HF |")
    print("|---|---|---|---|---|---|---|")
    for label, s, same in rows:
        agree = "—" if same is None else f"{same:.1%}"
        print(f"| {label} | {s:.2f} | {total / s:,.0f} | {1000 * s / n:.2f} | {s / stock_s:.2f}x | {hf_s / s:.2f}x "
              f"| {agree} |")


if __name__ == "__main__":
    main()
