"""How much of a decode step each small-kernel family costs in the replayed graph: the upper bound of fusing it away.

Run on a CUDA machine from the repository root:

    python bench/launch_ablation_probe.py [--model qwen2-0.5b] [--commitment TUPLE.json] [--batch 1] \
        [--skip norm,silu,rotary,reduce,all] [--rounds 3] [--steps 64] [--pdl on]

One model (a built-in config's seeded random weights, the detent arm, with `--commitment`'s tuple if given) decodes
`--batch` greedy requests from 128-token prompts through CUDA-graph decode. Each variant leaves one family's launches
out of the step (its graphs captured anew with the family skipped), and the variants alternate over `--rounds`:

- `norm`: every RMSNorm returns its input (and the residual unchanged): no launch;
- `silu`: SiLU-and-mul returns a [M, d] tensor of zeros made before the step: no launch;
- `rotary`: the rotary store returns q as it is and stores nothing;
- `reduce`: the split-K linears skip their chunk sums' combine (the output stays uninitialised);
- `all`: the four together.

The outputs are garbage, so this measures time only, never bits. The logits pass through `torch.nan_to_num` in
every variant, the plain one too (one launch more each, alike), so that garbage still samples a token in the
vocabulary. The token count per request is fixed (`max_tokens`, no stop tokens), so every variant times the same
number of steps. The saving is an upper bound for a fusion that removes the launches: the fused kernel does that
work inside another kernel. Printed: ms per decode step per variant (median over rounds) and its difference from
the plain step.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics

import torch

from detent_rl.bench_cases import decode_step_seconds
from detent_rl.kernels import matmul
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import layers, load_model
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams

FAMILIES = ("norm", "silu", "rotary", "reduce")


def _no_norm(x, weight, eps, *, block, num_warps, residual=None):
    return x if residual is None else (x, residual)


_ZEROS: dict = {}  # made once a shape, before the capture that reads them: no launch in the step


def _no_silu(gate_up, *, block):
    shape = (*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    key = (shape, gate_up.dtype, gate_up.device)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(shape, dtype=gate_up.dtype, device=gate_up.device)
    return _ZEROS[key]


def _no_rotary(q, k, v, positions, cos, sin, k_cache, v_cache, slots, *, block):
    return q, None


def _no_reduce(ws, bias, out):
    return None


_PATCHES = {"norm": (layers, "rmsnorm_autograd", _no_norm), "silu": (layers, "silu_and_mul_autograd", _no_silu),
            "rotary": (layers, "rotary_store_autograd", _no_rotary), "reduce": (matmul, "combine_splits", _no_reduce)}


@contextlib.contextmanager
def skipped(families: tuple[str, ...]):
    """The named families' launches left out while inside (the module attributes restored after)."""
    held = [(module, name, getattr(module, name)) for module, name, _ in (_PATCHES[f] for f in families)]
    try:
        for f in families:
            module, name, fake = _PATCHES[f]
            setattr(module, name, fake)
        yield
    finally:
        for module, name, real in held:
            setattr(module, name, real)


def step_ms(model, batch: int, prompt_len: int, steps: int, families: tuple[str, ...]) -> float:
    """Median ms per decode step of three timed runs after a warm-up, the families skipped (graphs captured so)."""
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=g).tolist()
    params = [SamplingParams(seed=i, temperature=0.0, max_tokens=steps + 1) for i in range(batch)]
    with skipped(families):
        engine = Engine.for_requests(model, batch, prompt_len + steps + 2, batch)
        walls = sorted(decode_step_seconds(engine, prompts, params) for _ in range(4))[1:]  # the first warms up
        del engine
    return 1e3 * walls[1]


def finite_logits(model) -> None:
    """The model's logits through `torch.nan_to_num`, in every variant alike: garbage still samples a real token."""
    logits = model.logits
    model.logits = lambda hidden: torch.nan_to_num(logits(hidden))


def variants(skip: str) -> list[tuple[str, tuple[str, ...]]]:
    out = [("plain", ())]
    for name in skip.split(","):
        if name == "all":
            out.append(("all", FAMILIES))
        elif name in FAMILIES:
            out.append((name, (name,)))
        else:
            raise SystemExit(f"--skip: {name!r} is not one of {', '.join(FAMILIES + ('all',))}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--commitment", default="", help="a tuned tuple file (else the detent arm's default)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--skip", default="norm,silu,rotary,reduce,all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--pdl", choices=("on", "off"), default="on")
    ap.add_argument("--device", default="cuda", help="cuda (the measurement); cpu runs the variants eagerly (a check)")
    args = ap.parse_args()
    runs = variants(args.skip)
    os.environ["DETENT_PDL"] = "1" if args.pdl == "on" else "0"  # read at each launch, so at graph capture
    path = builtin_checkpoint(args.model) if args.model in NAMES else args.model
    limits = dict(max_context=args.prompt_len + args.steps + 32, max_batch=max(64, args.batch), max_num_tokens=8192)
    commitment = CommitmentTuple.load(args.commitment) if args.commitment else None
    if commitment is not None:
        limits = {k: commitment.deployment[k] for k in limits}
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = load_model(path, "detent", device=args.device, dtype=dtype, commitment=commitment, **limits)
    finite_logits(model)
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    for _ in range(args.rounds):
        for name, families in runs:
            times[name].append(step_ms(model, args.batch, args.prompt_len, args.steps, families))
    plain = statistics.median(times["plain"])
    print(f"{args.model}, detent{' with ' + args.commitment if commitment else ''}, batch {args.batch}, PDL "
          f"{args.pdl}, {args.device}: ms per decode step, median of {args.rounds} rounds (each a median of 3)")
    print("| left out | ms/step | rounds | saved µs/step |\n|---|---|---|---|")
    for name, _ in runs:
        med = statistics.median(times[name])
        print(f"| {name} | {med:.3f} | {', '.join(f'{t:.3f}' for t in times[name])} | {1e3 * (plain - med):.1f} |")


if __name__ == "__main__":
    main()
