"""Shared harness of the row-wise kernel tests (CPU and GPU): selectors, bit comparisons, inputs."""
from __future__ import annotations

import math
from typing import Callable

import torch

from detent_rl.kernels.log_softmax import log_softmax, token_logprobs
from detent_rl.kernels.rmsnorm import rmsnorm
from detent_rl.selir.cache import JITCache
from detent_rl.selir.solver import solve

DTYPES = [torch.float32, torch.bfloat16]


EPS = 1e-6


MAX_ROWS = 8192


# (rtol, atol) against the references; bf16 outputs may differ by a rounding step or two.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}


# log-softmax output is fp32 whatever the input dtype; torch's own CPU log_softmax is off by up to
# ~3e-5 at vocab 151,936 (measured against float64), ten times the kernel's error.
LOGPROB_TOL = (1e-5, 1e-4)


EXACT_TOL = (1e-6, 1e-5)  # the kernel against float64


BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def selectors(program, **facts) -> tuple[Callable, Callable]:
    """(stock, detent) compiled selectors for the program under these facts."""
    sol = solve(program, dict(facts, max_rows=MAX_ROWS), cache=JITCache(enabled=False))
    return sol.stock(), sol.commit()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Row-major bit patterns: equality here is bit equality (+0 vs -0 included)."""
    t = t.reshape(t.shape[0], -1)
    return t.view(BITS[t.dtype]) if t.dtype in BITS else t


def _describe(a: torch.Tensor, b: torch.Tensor) -> str:
    a, b = a.reshape(-1), b.reshape(-1)
    bad = (_bits(a[None]) != _bits(b[None]))[0].nonzero()[:, 0]
    j = int(bad[0])
    return (f"{bad.numel()} of {a.numel()} elements differ, first at {j}: {a[j].item()!r} vs {b[j].item()!r}, "
            f"max |d| {(a.float() - b.float()).abs().max().item():.3g}")


def row_mismatches(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Rows r where a[r] and b[r] differ in any bit."""
    return (_bits(a) != _bits(b)).any(dim=1).nonzero()[:, 0].tolist()


Run = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def invariance_failures(run: Run, sizes: tuple[int, ...], *, probes: int = 6, seed: int = 0) -> list[str]:
    """Every failure of row invariance, with diagnostics.

    `run(idx)` computes a batch made of pool rows `idx` (selecting its parameters for len(idx)
    rows; the pool holds max(sizes) + probes rows) and returns tensors whose first dim is the row.
    For each batch size n, probe rows sit at random slots among other pool rows; each probe must
    equal its 1-row result, and every row must equal itself in the batch rolled to other slots.
    """
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(max(sizes) + probes, generator=g)
    probe_rows, fill = order[:probes], order[probes:]
    alone = {int(p): run(p.view(1)) for p in probe_rows}
    failures = []
    for n in sizes:
        idx = fill[torch.randperm(fill.numel(), generator=g)[:n]].clone()
        slots = torch.randperm(n, generator=g)[:min(n, probes)]
        idx[slots] = probe_rows[:slots.numel()]
        out = run(idx)
        for slot in slots.tolist():
            p = int(idx[slot])
            for k, (got, ref) in enumerate(zip(out, alone[p])):
                if row_mismatches(got[slot:slot + 1], ref):
                    failures.append(f"batch {n}, slot {slot} (pool row {p}), output {k}: vs alone: "
                                    f"{_describe(got[slot], ref[0])}")
        if n > 1:
            shift = n // 2 + 1
            rolled = run(idx.roll(shift))
            for k, (got, moved) in enumerate(zip(out, rolled)):
                for r in row_mismatches(got, moved.roll(-shift, dims=0)):
                    failures.append(f"batch {n}, row {r} (pool row {int(idx[r])}), output {k}: moved to slot "
                                    f"{(r + shift) % n}: {_describe(got[r], moved[(r + shift) % n])}")
    return failures


def alone_vs_batch(run: Run, n: int, every: int = 1) -> list[int]:
    """Pool rows 0..n-1 computed in one batch of n vs each alone (every `every`-th row): the rows whose
    bits differ."""
    batch = run(torch.arange(n))
    bad = set()
    for i in range(0, n, every):
        for got, ref in zip(run(torch.tensor([i])), batch):
            if row_mismatches(got, ref[i:i + 1]):
                bad.add(i)
    return sorted(bad)


def rstd_witness_rows(rows: int, hidden: int, seed: int = 0) -> torch.Tensor:
    """bf16 rows on which RMSNorm's output bits expose the association of the sum of squares.

    Random bf16 rows hide it: their squares carry few bits, so the fp32 sum is mostly exact in any
    order, and a 1-ulp change of rstd seldom moves a bf16 rounding. Here a quarter of each row is
    1.0, the rest is noise of log-uniform magnitude (squares whose low bits get rounded away, in an
    order-dependent way), tuned in float64 with ever smaller elements so that the exact rstd sits
    within two fp32 ulps of m = 1 + 2^-8 (offsets vary by row). m is a bf16 tie that rounds to 1.0,
    the next fp32 value rounds to 1 + 2^-7: y = (1.0 * rstd).to(bf16) hangs on the sum's last bits.
    """
    g = torch.Generator().manual_seed(seed)
    ones, tune = hidden // 4, 4
    n_noise = hidden - ones - tune
    out = torch.empty(rows, hidden, dtype=torch.bfloat16)
    for r in range(rows):
        rstd = 1.0 + 2.0 ** -8 + ((r % 33) - 16) * 2.0 ** -26
        target = hidden * (1.0 / rstd ** 2 - EPS)
        rest = -1.0
        while rest <= 0.0:
            noise = torch.randn(n_noise, generator=g, dtype=torch.float64) * torch.exp(
                -6.0 * torch.rand(n_noise, generator=g, dtype=torch.float64))
            noise = (noise * math.sqrt(0.9 * (target - ones) / noise.pow(2).sum().item())).to(torch.bfloat16)
            rest = target - ones - noise.double().pow(2).sum().item()
        small = []
        for _ in range(tune):
            t = torch.tensor([math.sqrt(rest)], dtype=torch.float64).to(torch.bfloat16)
            if t.double().item() ** 2 > rest:  # round down so the remainder stays >= 0
                t = (t.view(torch.int16) - 1).view(torch.bfloat16)
            small.append(t)
            rest -= t.double().item() ** 2
        out[r] = torch.cat([torch.ones(ones, dtype=torch.bfloat16), noise, *small])
    return out


def rmsnorm_run(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None, sel: Callable) -> Run:
    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, i = sel(idx.numel()), idx.to(x.device)
        out = rmsnorm(x[i], w, EPS, block=cfg.block, num_warps=cfg.num_warps,
                      residual=None if res is None else res[i])
        return out if isinstance(out, tuple) else (out,)
    return run


def rmsnorm_inputs(rows: int, hidden: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
    res = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
    return x, w, res


def log_softmax_run(logits: torch.Tensor, ids: torch.Tensor, sel: Callable, temperature: float = 1.0) -> Run:
    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, i = sel(idx.numel()), idx.to(logits.device)
        kw = dict(block=cfg.block, num_warps=cfg.num_warps, temperature=temperature)
        return log_softmax(logits[i], **kw), token_logprobs(logits[i], ids[i], **kw)
    return run


def logits_inputs(rows: int, vocab: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype).to(device)
    ids = torch.randint(0, vocab, (rows,), generator=g).to(device)
    return logits, ids


def rotary_store_case(tokens: int, heads: int, kv_heads: int, head_dim: int, rotary_dim: int, dtype: torch.dtype,
                      device: str = "cpu", page_size: int = 16, pad: int = 3, seed: int = 0) -> dict:
    """One step's inputs to rotary + k/v store, as the model passes them: q, k, v views of one fused qkv
    output, a rotate-half table of rotary_dim (<= head_dim), random caches and distinct random slots. The
    last `pad` tokens are the decode graph's padding: the first pad row's inputs at position 0, all
    written to one scratch slot (identical values, so the write order cannot matter)."""
    g = torch.Generator().manual_seed(seed)
    max_pos, pages = 4096, -(-tokens // page_size) + 2
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    slots = torch.randperm((pages - 1) * page_size, generator=g)[:tokens]
    if pad:
        qkv[-pad:], positions[-pad:], slots[-pad:] = qkv[-pad], 0, (pages - 1) * page_size
    qkv = qkv.to(device)
    q, k, v = (t.view(tokens, -1, head_dim) for t in qkv.split([heads * head_dim, kv_heads * head_dim,
                                                                   kv_heads * head_dim], dim=1))
    k_cache = torch.randn(pages, page_size, kv_heads, head_dim, generator=g).to(dtype).to(device)
    return dict(q=q, k=k, v=v, positions=positions.to(device), cos=emb.cos().to(dtype).to(device),
                sin=emb.sin().to(dtype).to(device), k_cache=k_cache, v_cache=torch.randn_like(k_cache),
                slots=slots.to(device))


def rotary_store_failures(case: dict, fused: Callable, rotate: Callable) -> list[str]:
    """Where `fused(q, k, v, positions, cos, sin, k_cache, v_cache, slots) -> q` differs in any bit from
    `rotate(q, k, positions, cos, sin) -> (q, k)` then `store_kv`: the new q and both whole caches."""
    from detent_rl.kernels.kv_store import store_kv
    c = case
    k_cache, v_cache = c["k_cache"].clone(), c["v_cache"].clone()
    q = fused(c["q"], c["k"], c["v"], c["positions"], c["cos"], c["sin"], k_cache, v_cache, c["slots"])
    ref_q, ref_k = rotate(c["q"], c["k"], c["positions"], c["cos"], c["sin"])
    ref_k_cache, ref_v_cache = c["k_cache"].clone(), c["v_cache"].clone()
    store_kv(ref_k, c["v"], ref_k_cache, ref_v_cache, c["slots"])
    pairs = (("q", q, ref_q), ("k_cache", k_cache, ref_k_cache), ("v_cache", v_cache, ref_v_cache))
    return [f"{name}: {_describe(a, b)}" for name, a, b in pairs if not torch.equal(_bits(a), _bits(b))]


def _hf_configs() -> dict:
    from transformers import LlamaConfig, Qwen2Config
    return {
        "default": Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        "linear": LlamaConfig(hidden_size=512, num_attention_heads=4,
                              rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
        "llama3": LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 512}),
        "yarn": Qwen2Config(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, rope_parameters={
            "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 1024}),
    }
