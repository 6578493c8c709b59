"""Where a GRPO step's trainer time goes: rescore, the update (grad-enabled forward, loss, backward,
AdamW), and the weight sync (digest on the trainer, the copy into the engine, digest there) by each
transport: one process (device tensors), two processes on one GPU (CUDA IPC), host copies.

    python bench/trainer_bench.py [--model qwen2-0.5b|tiny|smollm2-135m-instruct|PATH] [--arm detent]
        [--seqs 64] [--prompt 100] [--completion 32] [--micro 16] [--repeats 3] [--profile]

Synthetic samples (random prompt and completion tokens, advantages ±1) through the run's own
workers (`detent_rl.workers`), so the calls are the driver's; beside them, in the same process, a
stock trainer's update on the same checkpoint and samples (`stock_update`: what a user would run
instead; --no-stock skips it). Each phase is warmed up once, then
timed --repeats times (median, synchronized). --profile adds torch.profiler's top operators of one
update, by self CPU time and by device time.
"""
from __future__ import annotations

import argparse
import pickle
import random
import statistics
import struct
import subprocess
import sys
import time

import torch

from detent_rl.kernels.selections import ARMS
from detent_rl.models.builtin import NAMES, builtin_checkpoint
from detent_rl.config import RolloutSection, TrainSection
from detent_rl.models.weights import weights_sha256
from detent_rl.trainer.trainer import Sample
from detent_rl.workers import ModelSpec, RolloutWorker, TrainerWorker


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


PEAKS: dict[int, tuple[float, float]] = {}  # id(fn) -> (GB at the phase's peak, GB above its start)


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn` after one warm-up; on the GPU its memory peak goes into PEAKS."""
    fn()
    times = []
    if torch.cuda.is_available():
        sync()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated()
        PEAKS[id(fn)] = (peak / 2**30, (peak - start) / 2**30)
    return statistics.median(times)


_ENGINE = """
import pickle, struct, sys, time, torch
from detent_rl.models.weights import weights_digest
mine = None
while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    blob = sys.stdin.buffer.read(struct.unpack("<Q", head)[0])
    t = time.perf_counter()
    update = pickle.loads(blob)  # maps the trainer's memory (CUDA IPC)
    mine = mine or {n: torch.empty_like(v) for n, v in update.weights.items()}
    for n, v in update.weights.items():
        mine[n].copy_(v)
    ok = weights_digest(mine) == update.digest
    del update
    torch.cuda.synchronize()
    print(time.perf_counter() - t, ok, flush=True)
"""


def ipc_sync(trainer: TrainerWorker, repeats: int) -> tuple[float, float]:
    """The sync between two processes on this GPU by CUDA IPC (`TrainerWorker.weights("ipc")`, pickled as
    Ray would): median seconds on the trainer's side (digest, handles, pickle) and on an engine
    process's (open the handles, copy device to device, digest)."""
    child = subprocess.Popen([sys.executable, "-P", "-c", _ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=False)
    sides = []
    try:
        for _ in range(repeats + 1):
            sync()
            t = time.perf_counter()
            blob = pickle.dumps(trainer.weights("ipc"))
            here = time.perf_counter() - t
            child.stdin.write(struct.pack("<Q", len(blob)) + blob)
            child.stdin.flush()
            there, ok = child.stdout.readline().split()
            if ok != b"True":
                raise RuntimeError("the engine process's digest differs from the trainer's")
            sides.append((here, float(there)))
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    sides = sides[1:]  # the first opens the handles and warms up
    return statistics.median(s[0] for s in sides), statistics.median(s[1] for s in sides)


def stock_update(path: str, samples: list[Sample], micro: int, device: str, repeats: int,
                 profile: bool = False) -> float:
    """The update as a stock trainer makes it (TRL's GRPO shape): transformers' model with fp32 master
    weights under bf16 autocast, SDPA attention, cuBLAS, fused AdamW on the GPU, the LM head only over
    the completion positions (`logits_to_keep`); same samples, micro-batches and loss (policy gradient
    with the ratio to the detached logprobs). Seconds per update (median)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
    prompt = samples[0].num_prompt
    ids = torch.tensor([s.tokens for s in samples], device=device)
    adv = torch.tensor([s.advantage for s in samples], device=device)

    def update() -> None:
        for i in range(0, len(samples), micro):
            x, a = ids[i:i + micro], adv[i:i + micro]
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                logits = model(x, logits_to_keep=x.shape[1] - prompt + 1).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, x[:, prompt:, None]).squeeze(-1)
            loss = -(torch.exp(logp - logp.detach()) * a[:, None]).mean() * x.shape[0] / len(samples)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    seconds = timed(update, repeats), PEAKS.get(id(update))
    if profile:
        print_profile(update, device, "the stock trainer's update")
    return seconds


def print_profile(fn, device: str, what: str) -> None:
    """torch.profiler's top operators of one call of `fn` (by host time, and by GPU time on a GPU)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"## profile: {what}")
    print(table.table(sort_by="self_cpu_time_total", row_limit=25))
    if device == "cuda":
        print(table.table(sort_by="self_cuda_time_total", row_limit=25))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", help=f"a built-in ({', '.join(NAMES)}) or a checkpoint dir")
    ap.add_argument("--arm", default="detent", choices=ARMS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=100)
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-stock", action="store_true", help="skip the stock trainer (transformers) beside ours")
    ap.add_argument("--no-sync", action="store_true", help="skip the weight-sync rows")
    args = ap.parse_args()
    path = str(builtin_checkpoint(args.model)) if args.model in NAMES else args.model
    length = args.prompt + args.completion
    spec = ModelSpec(path=path, arm=args.arm, device=args.device, dtype="bfloat16", max_context=length,
                     max_batch=max(args.micro, 8), max_num_tokens=max(2048, args.micro * length))
    trainer = TrainerWorker(spec, TrainSection(lr=1e-6, micro_batch_size=args.micro))
    vocab = trainer.model.config.vocab_size
    rng = random.Random(0)
    samples = [Sample(f"r{i}", [rng.randrange(vocab) for _ in range(length)], args.prompt, [], 1.0,
                      advantage=rng.choice((-1.0, 1.0))) for i in range(args.seqs)]
    old = trainer.rescore(samples)
    for s, o in zip(samples, old):
        s.rollout_logprobs = o.tolist()
    rescore, update = (lambda: trainer.rescore(samples)), (lambda: trainer.train(samples, old))
    rows = {"rescore": timed(rescore, args.repeats), "update": timed(update, args.repeats)}
    peaks = {"rescore": PEAKS.get(id(rescore)), "update": PEAKS.get(id(update))}
    if args.profile:
        print_profile(update, args.device, "our update")
    if not args.no_sync:
        sync_rows(args, spec, trainer, rows)
    if not args.no_stock:  # same checkpoint, samples and micro-batches, in this process
        name = "stock trainer: update (transformers, bf16 autocast, SDPA, cuBLAS, AdamW)"
        rows[name], peaks[name] = stock_update(path, samples, args.micro, args.device, args.repeats, args.profile)
    tokens = args.seqs * length
    print(f"{args.model}, {args.arm}, {args.device}: {args.seqs} sequences x ({args.prompt} prompt + "
          f"{args.completion} completion) tokens, micro-batches of {args.micro}")
    print("| phase | s | tokens/s | GPU memory at the peak, GB (above the phase's start) |\n|---|---|---|---|")
    for name, s in rows.items():
        rate = f"{tokens / s:,.0f}" if name in ("rescore", "update") or "update (" in name else ""
        peak = f"{peaks[name][0]:.1f} (+{peaks[name][1]:.1f})" if peaks.get(name) else ""
        print(f"| {name} | {s:.3f} | {rate} | {peak} |")


def sync_rows(args, spec: ModelSpec, trainer: TrainerWorker, rows: dict) -> None:
    """The weight sync, both ways the driver makes it (detent_rl.train.sync_weights), timed into `rows`."""
    rollout = RolloutWorker(spec, RolloutSection(num_blocks=8, max_num_seqs=8, chunk_size=256, cuda_graphs="off"))
    # in one process the engine copies the trainer's device tensors; between Ray actors host copies travel
    rows["sync in one process: digest, device-to-device copy, digest"] = timed(
        lambda: rollout.update_weights(trainer.weights("device")), args.repeats)
    rows["sync between processes: digest + host copies (trainer)"] = timed(trainer.weights, args.repeats)
    update = trainer.weights()
    rows["sync between processes: copy in + digest (engine)"] = timed(lambda: rollout.update_weights(update),
                                                                      args.repeats)
    if args.device == "cuda":
        here, there = ipc_sync(trainer, args.repeats)
        rows["sync between processes on one GPU, CUDA IPC: digest + handles (trainer)"] = here
        rows["sync between processes on one GPU, CUDA IPC: open + device copy + digest (engine)"] = there
    rows["for comparison: weights_sha256 of the compute weights (the former check)"] = timed(
        lambda: weights_sha256(trainer.trainer.compute_weights(on_device=True)), args.repeats)


if __name__ == "__main__":
    main()
