"""Where a linear call's host time goes, piece by piece, against cuBLAS's (CUDA, sm_90 for the warpgroup path).

    PYTHONPATH=$(bash bench/link_package.sh .) python -P bench/linear_host_pieces.py [--model qwen2-0.5b]
        [--commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json] [--m 303] [--sites 4]

For the first `--sites` distinct linears of the model (loaded as the detent arm with the tuple), at M = `--m`
rows: each piece of the tuned call (`Linear._linear`, then each layer below it down to Triton's launcher with its
arguments prebuilt) and `torch.nn.functional.linear` on the same operands, issued back to back without a sync,
µs a call (median of 7 loops of 300). An eager step (a prefill chunk, a mixed step) is host-bound: these are its
linears' share (docs/BENCHMARKS.md, sessions 32-33)."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from detent_rl.kernels import _triton, launch, matmul, matmul_wgmma, matmul_wgmma_plan
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.models.layers import Linear


def host_us(fn, n: int = 300) -> float:
    fn()
    fn()
    torch.cuda.synchronize()
    loops = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        loops.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(loops)


def pieces(lin: Linear, m: int) -> dict:
    x = torch.randn(m, lin.weight.shape[1], device="cuda", dtype=lin.weight.dtype)
    w, b = lin.weight, lin.bias
    p = matmul.launch_params(lin._select(m))
    lin._linear(x, b)  # its plan made and recorded
    plan = next(v for k, v in matmul_wgmma_plan._PLANS.items() if k[2:5] == (m, w.shape[0], w.shape[1]))
    out = torch.empty(m, w.shape[0], device="cuda", dtype=x.dtype)
    ws = x.new_empty(plan.ws_shape, dtype=torch.float32) if plan.splits > 1 else None
    tensors = {"x": x, "w": w, "out": out, "ws": ws, "bias": b}
    record = plan.kernel
    held = {}
    real = record.raw
    record.raw = lambda *a: held.setdefault("args", a) and real(*a)
    record(tensors)
    record.raw = real
    args = held["args"]
    active = launch._fast_launch_parts()[0].active
    return {
        "Linear._linear": lambda: lin._linear(x, b),
        "cuBLAS (F.linear)": lambda: matmul.stock_linear(x, w, b),
        "selection + launch_params": lambda: matmul.launch_params(lin._select(m)),
        "matmul.linear (routed)": lambda: matmul.linear(x, w, b, **p),
        "its checks: check_operands": lambda: matmul.check_operands(x, w, b),
        "its checks: wgmma applies": lambda: matmul_wgmma.applies(x, w, p["block_k"]),
        "its checks: pdl(x)": lambda: _triton.pdl(x),
        "torch.empty(out)": lambda: torch.empty((m, w.shape[0]), dtype=x.dtype, device=x.device),
        "x.new_empty(out)": lambda: x.new_empty((m, w.shape[0])),
        "plan(x, w, b)": lambda: plan(x, w, b),
        "plan.launch (into out)": lambda: plan.launch(x, w, b, out, ws),
        "Recorded (the kernel's)": lambda: record(tensors),
        "  _usable_parts": launch._usable_parts,
        "  current device": active.get_current_device,
        "  Triton's launcher, arguments prebuilt": lambda: real(*args),
        "  fill_tma_descriptor": lambda: active.utils.fill_tma_descriptor(x.data_ptr(), *record.map_slots[0][3]),
    }, p, plan.splits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--commitment", default="bench/tuned/h200_qwen2-0.5b_grpo32x8.json")
    ap.add_argument("--m", type=int, default=303)
    ap.add_argument("--sites", type=int, default=4)
    args = ap.parse_args()
    model = load_model(builtin_checkpoint(args.model), "detent", device="cuda", dtype=torch.bfloat16,
                       commitment=CommitmentTuple.load(args.commitment), max_context=784, max_batch=256,
                       max_num_tokens=8192)
    seen, sites = set(), []
    for module in model.modules():
        if isinstance(module, Linear) and tuple(module.weight.shape) not in seen:
            seen.add(tuple(module.weight.shape))
            sites.append(module)
    with torch.inference_mode():
        for lin in sites[:args.sites]:
            fns, p, splits = pieces(lin, args.m)
            print(f"\n{tuple(lin.weight.shape)} M={args.m}, {splits} split(s): {p}")
            for name, fn in fns.items():
                print(f"  {name:42s} {host_us(fn):6.2f} µs", flush=True)


if __name__ == "__main__":
    main()
