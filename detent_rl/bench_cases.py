"""The benchmark's cases (`python -m detent_rl.bench` runs them per arm): the shapes, one engine per case on a
loaded model, and the timings each reports; the engine-phase timers the bench tools share.
"""
from __future__ import annotations

import gc
import os
import random
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch

from detent_rl.kernel_times import kernel_times
from detent_rl.kernels.launch import counting_compiles
from detent_rl.kernels.matmul import launch_params, linear, stock_linear
from detent_rl.models.layers import Linear
from detent_rl.models.model import CausalLM
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.timing import GcPauses, cold_copies, graph_seconds, median_seconds, sync

# 256: a GRPO batch's decode; 640-1,024: a serve's eager steps (768: the matmul program's FILL_M, its mid-M rule's end)
GEMM_MS = (1, 8, 32, 128, 256, 512, 640, 768, 1024, 2048, 8192)


@dataclass(frozen=True)
class Shapes:
    decode_prompt: int = 128
    decode_new: int = 128
    poisson_requests: int = 64
    poisson_prompt: tuple[int, int] = (64, 512)
    poisson_new: tuple[int, int] = (32, 256)
    poisson_slots: int = 64  # the online engine's sequences in flight
    # serves of the trace a round (one warm-up): an arm's result is its median-p50 serve. One 64-request serve's
    # p50 moved its ratio to stock from 0.73x to 1.41x between rounds (1.5B, H100, session 39)
    poisson_serves: int = 5
    grpo: tuple[int, int, int, int] = (32, 8, 200, 256)  # prompts, samples, prompt tokens, new tokens
    long: tuple[int, int, int] = (2, 12000, 64)  # batch, prompt tokens, new tokens
    repeats: int = 3
    grpo_repeats: int = 5  # the GRPO batch's runs a round: its prefill is host-bound and scatters (session 33)

    def slots(self, case: str) -> Optional[int]:
        """The case's engine's sequences in flight, its maximum concurrency (None: no engine, the gemm case)."""
        return {"decode-1": 1, "decode-32": 32, "poisson": self.poisson_slots, "grpo": self.grpo[0] * self.grpo[1],
                "long": self.long[0]}.get(case)


QUICK = Shapes(decode_prompt=16, decode_new=6, poisson_requests=6, poisson_prompt=(4, 24), poisson_new=(2, 6),
               grpo=(2, 2, 12, 6), long=(2, 96, 4), repeats=1, grpo_repeats=1, poisson_serves=1)


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes per second a device-to-device copy moves (read + write), the HBM roofline's bandwidth."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, 5)
    return 2 * nbytes / seconds


def weight_bytes(model: CausalLM) -> int:
    """Bytes a decode step reads at least once: every parameter (a tied matrix once)."""
    seen = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def _pieced(engine: Engine) -> dict:
    """{"piece_steps": steps the engine ran through its step graphs (every run's), and "whole_steps": those of them
    through whole-step graphs}, where it has them."""
    if engine.steps is None:
        return {}
    whole = getattr(engine.steps, "whole_runs", None)
    return {"piece_steps": sum(engine.steps.runs.values()) + sum((whole or {}).values()),
            **({"whole_steps": sum(whole.values())} if whole is not None else {})}


def _captured(engine: Engine) -> int:
    """CUDA graphs the engine holds (decode graphs and each piece size's): a serve that captures one stalls for it."""
    return (len(engine.graphs.graphs) if engine.graphs is not None else 0) + \
        (len(engine.steps.graphs) + len(getattr(engine.steps, "whole", ())) if engine.steps is not None else 0)


def _reserved(device: torch.device) -> int:
    """Bytes the caching allocator holds on a CUDA device (0 elsewhere), after a collection: an engine of an
    earlier case or round left in a reference cycle frees its graph pools when the collector reaches it, which
    made one warm-up's figure -354 MiB (the H200, session 41)."""
    if device.type != "cuda":
        return 0
    gc.collect()
    torch.cuda.synchronize(device)
    return torch.cuda.memory_reserved(device)


class Bench:
    def __init__(self, model: CausalLM, shapes: Shapes, step_graphs: bool | str = False,
                 kernels: bool = False) -> None:
        """`step_graphs`: every engine runs its prefill and mixed steps through piecewise graphs (True), or through
        whole-step graphs ("whole": `Engine`'s `full_steps`), the same in every arm. `kernels`: the Poisson case
        serves the trace once more, after the timed serve, under the torch profiler, and reports its time by kernel
        (`kernel_times`)."""
        self.model, self.shapes, self.vocab = model, shapes, model.config.vocab_size
        self.device, self.step_graphs, self.kernels = model.device, step_graphs, kernels

    def _engine(self, sequences: int, tokens: int, batch: int) -> Engine:
        batch = min(batch, self.model.selections.deployment.max_batch)
        return Engine.for_requests(self.model, sequences, tokens, batch, step_graphs=self.step_graphs is True,
                                   full_steps=self.step_graphs == "whole")

    def _run(self, engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list:
        engine.flush_cache()  # every run prefills its prompts
        return engine.generate(prompts, params)

    def decode(self, batch: int, prompt: int, new: int) -> dict:
        """ms per decode step at `batch`: the steps after every request's first token, timed alone
        (median of the repeats)."""
        prompts = _prompts(batch, prompt, self.vocab, seed=batch)
        engine = self._engine(batch, prompt + new, batch)
        params = [SamplingParams(seed=i, temperature=0.0, max_tokens=new) for i in range(batch)]
        times = [decode_step_seconds(engine, prompts, params) for _ in range(self.shapes.repeats + 1)][1:]
        return {"ms_per_step": 1e3 * sorted(times)[len(times) // 2]}

    def poisson(self, arrivals: list[float], trace: list[tuple[list[int], SamplingParams]]) -> dict:
        """Serve the trace online, each request added at its arrival time; latency per output token. The
        engine warms up first, as an online engine starts (`Engine.warmup`: every kernel variant its steps can
        launch compiled, every decode graph captured; without it the timed run held 0.2-0.8 s compile stalls
        in every arm, the H200, session 31), then serves the trace all at once, untimed. Then it serves the trace
        `Shapes.poisson_serves` times, each on a flushed cache, and the result is the serve with the median p50
        (`serves_p50_ms`: every serve's p50, in order): a serve of a few seconds queues otherwise on every stall,
        and its p50 scatters. `compiles`: the Triton variants compiled inside the timed serves (0 when the
        warm-up left nothing)."""
        longest = max(len(p) + sp.max_tokens for p, sp in trace)
        engine = self._engine(len(trace), longest, self.shapes.poisson_slots)
        held = _reserved(self.device)
        warm = engine.warmup(tuple(sorted({sp.temperature if sp.temperature > 0 else 1.0 for _, sp in trace})))
        warm_mib = (_reserved(self.device) - held) / 2 ** 20  # its graphs' pools, what its compiles kept
        self._run(engine, [p for p, _ in trace], [sp for _, sp in trace])
        serves = []
        with counting_compiles() as compiled:
            for _ in range(self.shapes.poisson_serves):
                engine.flush_cache()
                serves.append(self._serve(engine, arrivals, trace))
        out = dict(sorted(serves, key=lambda r: r["p50_ms"])[(len(serves) - 1) // 2])
        out["serves_p50_ms"] = [r["p50_ms"] for r in serves]
        if self.kernels:  # (its steps batch a little otherwise than the timed serve's: the profiler costs host time)
            engine.flush_cache()
            times = kernel_times(lambda: self._serve(engine, arrivals, trace), self.device)
            out["kernels"] = [[name, n, us / 1e3] for name, (n, us) in times.items()]  # name, launches, ms
        return {**out, "compiles": len(compiled), "compiled": sorted(set(compiled)), "warmup_s": warm["seconds"],
                "warmup_mib": warm_mib,
                **_pieced(engine)}

    def _serve(self, engine: Engine, arrivals: list[float], trace: list[tuple[list[int], SamplingParams]]) -> dict:
        order = sorted(range(len(trace)), key=lambda i: arrivals[i])
        seqs, finished, at, steps, eager = {}, {}, 0, [], []  # eager: each step call's tokens in `_step` steps
        captured, step_gc = _captured(engine), []  # step_gc: the collector's ms inside each step call
        t0 = time.perf_counter()
        with GcPauses() as collector:
            while at < len(order) or not engine.idle:
                now = time.perf_counter() - t0
                while at < len(order) and arrivals[order[at]] <= now:
                    i = order[at]
                    seqs[engine.add(*trace[i]).seq_id] = i
                    at += 1
                if engine.idle:
                    time.sleep(max(0.0, arrivals[order[at]] - now))
                    continue
                t_step, before, tokens, gc_ms = time.perf_counter(), engine.eager_steps, engine.eager_tokens, \
                    collector.ms
                for s in engine.step():
                    finished[seqs[s.seq_id]] = (time.perf_counter() - t0, len(s.completion))
                steps.append(time.perf_counter() - t_step)
                step_gc.append(collector.ms - gc_ms)
                eager.append(engine.eager_tokens - tokens if engine.eager_steps > before else 0)
        per_token = sorted((end - arrivals[i]) / n for i, (end, n) in finished.items())
        slowest = max(range(len(steps)), key=steps.__getitem__)
        pick = lambda q: 1e3 * per_token[min(len(per_token) - 1, int(q * len(per_token)))]  # noqa: E731
        # the host's time in each step call: a compile or another stall inside the timed run shows as the slowest;
        # the step calls that ran an eager step (prefill, mixed) apart from those that only replayed decode graphs
        return {"p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99),
                "wall_s": max(end for end, _ in finished.values()), "steps": len(steps),
                "step_median_ms": 1e3 * statistics.median(steps), "step_max_ms": 1e3 * max(steps),
                "eager_steps": sum(map(bool, eager)), "eager_ms": 1e3 * sum(t for t, e in zip(steps, eager) if e),
                "eager_tokens_median": statistics.median([e for e in eager if e] or [0]),
                "eager_tokens_max": max(eager),
                "step_max_tokens": eager[slowest],  # 0: a decode replay
                # the collector's passes over the serve (all of it, steps and the host's waits between them): a full
                # pass walks every tracked object, and one inside a step holds every decoding request's next token
                "gc_full": collector.full, "gc_ms": collector.ms, "gc_step_max_ms": step_gc[slowest],
                "captures": _captured(engine) - captured,
                "graph_ms": 1e3 * sum(t for t, e in zip(steps, eager) if not e)}

    def offline(self, trace: list[tuple[list[int], SamplingParams]]) -> float:
        """Seconds to serve the whole trace submitted at once."""
        longest = max(len(p) + sp.max_tokens for p, sp in trace)
        engine = self._engine(len(trace), longest, self.shapes.poisson_slots)
        return median_seconds(lambda: self._run(engine, [p for p, _ in trace], [sp for _, sp in trace]),
                            self.device, 1)

    def grpo(self, prompts: int, samples: int, prompt: int, new: int) -> dict:
        """Output tokens per second over the whole batch; and its two phases (the medians of the timed
        runs): until every sequence has its first token (the prefill), then ms per decode step."""
        group = _prompts(prompts, prompt, self.vocab, seed=7)
        batch = [p for p in group for _ in range(samples)]
        params = [SamplingParams(seed=i, temperature=1.0, max_tokens=new) for i in range(len(batch))]
        engine = self._engine(len(batch), prompt + new, len(batch))  # the whole group batch at once
        phases: list[tuple[float, float]] = []

        seconds = median_seconds(lambda: phases.append(phase_seconds(engine, batch, params)), self.device,
                                 self.shapes.grpo_repeats)
        timed = phases[1:]  # not the warm-up's
        return {"tok_per_s": len(batch) * new / seconds, "wall_s": seconds,
                "prefill_s": statistics.median(p for p, _ in timed),
                "decode_ms_per_step": 1e3 * statistics.median(d for _, d in timed), **_pieced(engine)}

    def gemm(self) -> list[dict]:
        """Each linear site against cuBLAS: CUDA-graph replays, µs per call (CUDA only). Our kernel is timed
        with its programmatic dependent launch off (`ratio`: the kernel alone, as cuBLAS runs) and on
        (`ratio_pdl`): replays of one GEMM overlap their neighbours under PDL, which a step never does (its
        GEMMs follow other kernels), and which helps a small launch and slows a persistent one."""
        bench = lambda fn: graph_seconds(fn) * 1e6  # noqa: E731
        held = os.environ.get("DETENT_PDL")
        sel = self.model.selections
        rows, seen = [], set()
        limit = sel.deployment.max_num_tokens
        for module in self.model.modules():
            if not isinstance(module, Linear) or tuple(module.weight.shape) in seen:
                continue
            seen.add(tuple(module.weight.shape))
            n, k = module.weight.shape
            w = cold_copies(module.weight)  # read from HBM at every call, as in a step
            selector = sel.get("matmul", n=n, k=k)
            for m in (m for m in GEMM_MS if m <= limit):
                x = torch.randn(m, k, device=module.weight.device).to(module.weight.dtype)
                cublas = bench(lambda: stock_linear(x, w()))
                ours = {}
                for flag in ("0", "1"):
                    os.environ["DETENT_PDL"] = flag  # read at each launch (and graph capture)
                    ours[flag] = bench(lambda: linear(x, w(), None, **launch_params(selector(m))))
                rows.append({"site": f"{k}->{n}", "m": m, "cublas_us": cublas, "ratio": ours["0"] / cublas,
                             "ratio_pdl": ours["1"] / cublas, "chunk": selector(m).chunk})
        if held is None:
            os.environ.pop("DETENT_PDL", None)
        else:
            os.environ["DETENT_PDL"] = held
        return rows


def prefilled(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> None:
    """Add the requests to a flushed cache and step until every one has its first token (the prefill
    done): what follows is decode steps alone."""
    engine.flush_cache()
    seqs = [engine.add(p, sp) for p, sp in zip(prompts, params)]
    while not engine.idle and any(not s.completion for s in seqs):
        engine.step()
    sync(engine.model.device)


def phase_seconds(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, float]:
    """(seconds until every request has its first token, seconds per engine step after that): what
    generate() does, with one sync where the prefill ends."""
    t0 = time.perf_counter()
    prefilled(engine, prompts, params)
    t1, steps = time.perf_counter(), 0
    while not engine.idle:
        engine.step()
        steps += 1
    sync(engine.model.device)
    return t1 - t0, (time.perf_counter() - t1) / max(steps, 1)


def decode_step_seconds(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    """Seconds per engine step once every request has its first token (the prefill steps left out)."""
    return phase_seconds(engine, prompts, params)[1]


def trace_of(shapes: Shapes, vocab: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(11)
    return [([rng.randrange(vocab) for _ in range(rng.randint(*shapes.poisson_prompt))],
             SamplingParams(seed=100 + i, temperature=1.0, max_tokens=rng.randint(*shapes.poisson_new)))
            for i in range(shapes.poisson_requests)]


def poisson_arrivals(n: int, rate: float, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out
