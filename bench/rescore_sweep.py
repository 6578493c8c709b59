"""Rollout vs rescore, bit for bit, across prompt lengths, completion lengths and batch sizes.

Run from the repository root (CUDA by default; --device cpu for a small smoke run):

    python bench/rescore_sweep.py [--model qwen2-0.5b|PATH] [--arm detent] [--dtype bf16] [--commitment FILE]

Each case generates a batch in GRPO's shape — `group` samples per prompt with different seeds at
T = 1, so the group shares its prompt's full pages through the prefix cache — with chunked
prefill (`chunk` tokens per chunk) under a token budget, then rescores every sequence the
trainer's way (one prefill of prompt + completion) and compares the logprobs bit for bit. With
`--commitment` (a tuned tuple, detent arm) the deployment limits are the tuple's own, and the cases
are those that fit them plus a GRPO batch at the limits (the tuple's batch, 200-token prompts). Prints
a markdown table (case, sequences, tokens compared, prefix-cached prompt tokens, mismatching
sequences, first mismatch) and exits 1 if any token differs.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams

CONFIGS = {
    "qwen2-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True),
    "tiny-qwen2": dict(model_type="qwen2", vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       rms_norm_eps=1e-6, rope_theta=1e4, tie_word_embeddings=False),
}


@dataclass(frozen=True)
class Case:
    name: str
    prompts: int  # distinct prompts
    group: int  # samples per prompt (GRPO group size)
    prompt_len: tuple[int, int]  # uniform range
    new_tokens: tuple[int, int]
    chunk: int
    budget: int


CASES = (
    Case("batch 1, 1-token prompt, 1 new token", 1, 1, (1, 1), (1, 1), 256, 8192),
    Case("batch 1, 2048-token prompt, 512 new", 1, 1, (2048, 2048), (512, 512), 512, 8192),
    Case("batch 8, prompts 1-64, new 1-32", 8, 1, (1, 64), (1, 32), 16, 64),
    Case("batch 64 = 8 prompts x 8 samples, prompts 1-2048, new 1-512", 8, 8, (1, 2048), (1, 512), 512, 8192),
    Case("batch 64 distinct, prompts 16-512, new 64-256, chunks of 100", 64, 1, (16, 512), (64, 256), 100, 2048),
)


def grpo_case(max_batch: int, max_context: int, max_num_tokens: int) -> Case:
    """A GRPO step's rollout at a tuple's limits: groups of 8, prompts up to 200 tokens, the rest decoded."""
    prompt = min(200, max_context // 2)
    return Case(f"GRPO batch {max_batch} = {max_batch // 8} prompts x 8, prompts 1-{prompt}, "
                f"new 1-{max_context - prompt}",
                max(1, max_batch // 8), min(8, max_batch), (1, prompt), (1, max_context - prompt), 512, max_num_tokens)


SMOKE = (  # --device cpu: the same shapes, scaled down
    Case("batch 1, 1-token prompt", 1, 1, (1, 1), (1, 1), 256, 512),
    Case("batch 8 = 2 x 4, prompts 1-80, new 1-12", 2, 4, (1, 80), (1, 12), 16, 64),
)


def checkpoint(name: str, root: Path) -> Path:
    if name not in CONFIGS:
        if not (Path(name) / "config.json").is_file():
            raise SystemExit(f"--model {name}: neither a built-in config {sorted(CONFIGS)} nor a checkpoint directory")
        return Path(name)
    import transformers
    transformers.logging.set_verbosity_error()
    cfg = dict(CONFIGS[name])
    cls = {"qwen2": "Qwen2"}[cfg.pop("model_type")]
    torch.manual_seed(0)
    model = getattr(transformers, f"{cls}ForCausalLM")(getattr(transformers, f"{cls}Config")(**cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / name)
    return root / name


def run_case(model, case: Case, seed: int) -> dict:
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompts, params = [], []
    for p in range(case.prompts):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(*case.prompt_len))]
        for j in range(case.group):
            prompts.append(prompt)
            params.append(SamplingParams(seed=rng.randrange(2**62), temperature=1.0,
                                         max_tokens=rng.randint(*case.new_tokens)))
    longest = max(len(p) + sp.max_tokens for p, sp in zip(prompts, params))
    pages = sum(-(-(len(p) + sp.max_tokens) // model.page_size) for p, sp in zip(prompts, params)) + 8
    engine = Engine(model, num_blocks=pages, max_num_seqs=len(prompts), max_num_tokens=case.budget,
                    chunk_size=case.chunk)
    seqs = engine.generate(prompts, params)
    bad, first, compared = 0, "", 0
    for i, s in enumerate(seqs):
        again = engine.rescore(s)
        compared += len(again)
        if again != s.logprobs:
            bad += 1
            k = next(j for j, (a, b) in enumerate(zip(again, s.logprobs)) if a != b)
            first = first or f"seq {i} token {k}: {s.logprobs[k]!r} vs {again[k]!r}"
    return {"seqs": len(seqs), "tokens": compared, "cached": sum(s.num_cached for s in seqs), "bad": bad,
            "first": first or "—", "longest": longest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="built-in config or checkpoint dir (default: qwen2-0.5b on "
                                                  "cuda, tiny-qwen2 on cpu)")
    ap.add_argument("--arm", default="detent", choices=("stock", "det", "detent"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commitment", help="a tuned tuple (python -m detent_rl.tune), detent arm: its deployment's "
                                         "limits, the cases that fit them and a GRPO batch at them")
    args = ap.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    name = args.model or ("qwen2-0.5b" if args.device == "cuda" else "tiny-qwen2")
    cases = CASES if args.device == "cuda" else SMOKE
    longest = max(c.prompt_len[1] + c.new_tokens[1] for c in cases)
    limits = dict(max_context=-(-longest // 256) * 256, max_batch=64, max_num_tokens=8192)
    commitment = None
    if args.commitment:
        if args.arm != "detent":
            ap.error(f"--commitment: a tuple is the detent arm's, not --arm {args.arm}'s")
        commitment = CommitmentTuple.load(args.commitment)
        dep = commitment.deployment or {}
        absent = [k for k in limits if k not in dep]
        if absent:
            ap.error(f"--commitment {args.commitment}: its deployment records no {absent}")
        limits = {k: dep[k] for k in limits}
        fits = [c for c in cases if c.prompt_len[1] + c.new_tokens[1] <= limits["max_context"]
                and c.prompts * c.group <= limits["max_batch"] and c.budget <= limits["max_num_tokens"]]
        cases = (*fits, grpo_case(**limits))
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(checkpoint(name, Path(tmp)), args.arm, device=args.device, dtype=dtype,
                           commitment=commitment, **limits)
        tuple_note = f", tuple {args.commitment} (sha256 {commitment.sha256()[:12]})" if commitment else ""
        print(f"model {name}, {args.arm} arm, {args.dtype}, {args.device}{tuple_note}\n")
        print("| case | sequences | logprobs compared | prefix-cached prompt tokens | mismatching sequences | "
              "first mismatch |")
        print("|---|---|---|---|---|---|")
        failed = False
        for i, case in enumerate(cases):
            r = run_case(model, case, args.seed + i)
            failed |= r["bad"] > 0
            print(f"| {case.name} | {r['seqs']} | {r['tokens']} | {r['cached']} | {r['bad']} | {r['first']} |",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
