"""Seeded sampling on the CPU (PyTorch path): the noise is MurmurHash3 of (seed, position, id),
draws follow softmax(logits / T) under top-k/top-p, greedy and tie rules hold, the logprob is
token_logprobs' bits, and a row's (token, logprob) does not depend on the batch around it; a stock
sampler (one global seed per step, torch.multinomial over the batch) visibly does.

The Triton kernels also run once under TRITON_INTERPRET=1 on tiny shapes (logic only).
"""
from __future__ import annotations

import math
import struct
import textwrap
from collections.abc import Callable

import pytest
import torch

from detent_rl.kernels.log_softmax import log_softmax, token_logprobs
from detent_rl.kernels.noise import message_hash
from detent_rl.kernels.sampling import sample, sample_ref, sample_unfiltered
from detent_rl.kernels.programs.rows import log_softmax_program
from test_kernels_rows import invariance_failures, selectors
from interpreted import run_interpreted

TEMPS = (0.0, 0.7, 1.0, 1.3)


# ---------------------------------------------------------------------------------------------
# harness (shared with test_kernels_sampling_gpu.py)

def sampling_inputs(rows: int, vocab: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> dict:
    """Logits and per-row parameters, mixed: greedy and sampled rows, top-k/top-p on and off."""
    g = torch.Generator().manual_seed(seed)

    def pick(values: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype)[torch.randint(0, len(values), (rows,), generator=g)].to(device)
    return {
        "logits": (torch.randn(rows, vocab, generator=g) * 3).to(dtype).to(device),
        "seeds": torch.randint(-2 ** 63, 2 ** 63 - 1, (rows,), generator=g).to(device),
        "positions": torch.randint(0, 1 << 20, (rows,), generator=g).to(device),
        "temperature": pick(TEMPS, torch.float32),
        "top_k": pick((0, 1, 20, 50, vocab), torch.int64),
        "top_p": pick((1.0, 0.95, 0.8, 0.3), torch.float32),
    }


def sampling_run(inp: dict, sel: Callable) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, i = sel(idx.numel()), idx.to(inp["logits"].device)
        return sample(inp["logits"][i], inp["seeds"][i], inp["positions"][i], temperature=inp["temperature"][i],
                      top_k=inp["top_k"][i], top_p=inp["top_p"][i], block=cfg.block, num_warps=cfg.num_warps)
    return run


def draw(logits_row: torch.Tensor, n: int, *, temperature: float, top_k: int = 0, top_p: float = 1.0,
         seeds: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """n draws for one logits row: seeds spread over int64 at position 17 unless given.

    The draws do not depend on the block; the narrowest one covering the row keeps the CPU
    log-softmax folds (which pad each row to `block` lanes) cheap on tiny vocabularies.
    """
    dev = logits_row.device
    block = max(16, min(1024, 1 << (logits_row.numel() - 1).bit_length()))
    seeds = torch.arange(n, device=dev) * 0x9E3779B1 + 12345 if seeds is None else seeds
    positions = torch.full((n,), 17, device=dev) if positions is None else positions
    tokens, _ = sample(logits_row.expand(n, -1), seeds, positions, block=block,
                       temperature=torch.full((n,), temperature, device=dev),
                       top_k=torch.full((n,), top_k, device=dev), top_p=torch.full((n,), top_p, device=dev))
    return tokens


def expected_probs(logits_row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """float64 sampling distribution after top-k then top-p; refuses boundary cases within 1e-3."""
    x = logits_row.double().cpu() / temperature
    order = torch.sort(logits_row.double().cpu(), descending=True, stable=True).indices
    if 0 < top_k < x.numel():
        x[order[top_k:]] = float("-inf")
    p = torch.softmax(x, 0)
    if top_p < 1.0:
        ps, order = torch.sort(p, descending=True, stable=True)
        cum = torch.cumsum(ps, 0)
        assert (cum - top_p).abs().min() > 1e-3, "test case too close to the top-p boundary"
        n = int((cum < top_p).sum()) + 1
        p[order[n:]] = 0.0
    return p / p.sum()


def chi_square_ok(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[bool, str]:
    """Pearson chi-square over the ids with p > 0 at significance 1e-4 (Wilson-Hilferty quantile)."""
    n = tokens.numel()
    counts = torch.bincount(tokens.cpu(), minlength=probs.numel()).double()
    support = probs > 0
    stat = (((counts - n * probs) ** 2)[support] / (n * probs[support])).sum().item()
    df = int(support.sum()) - 1
    if df == 0:
        return bool((counts[~support] == 0).all()), f"counts {counts.tolist()}"
    z = 3.719  # upper 1e-4 normal quantile
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    ok = stat < crit and bool((counts[~support] == 0).all())
    return ok, f"chi2 {stat:.2f} (crit {crit:.2f}, df {df}); freq {(counts / n).tolist()} vs {probs.tolist()}"


def stock_sample(logits: torch.Tensor, temperature: torch.Tensor, step_seed: int) -> torch.Tensor:
    """How engines ship it: one global seed per step, multinomial over the whole batch."""
    with torch.random.fork_rng(devices=[logits.device] if logits.is_cuda else []):
        torch.manual_seed(step_seed)
        probs = torch.softmax(logits.float() / temperature[:, None], dim=-1)
        return torch.multinomial(probs, 1)[:, 0]


def _murmur3_32(data: bytes, seed: int = 0) -> int:
    """Scalar MurmurHash3_x86_32, written from the algorithm's description."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    def scramble(k: int) -> int:
        return (rotl((k * 0xCC9E2D51) & 0xFFFFFFFF, 15) * 0x1B873593) & 0xFFFFFFFF
    h, full = seed, len(data) // 4 * 4
    for i in range(0, full, 4):
        h = (rotl(h ^ scramble(int.from_bytes(data[i:i + 4], "little")), 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    if len(data) > full:
        h ^= scramble(int.from_bytes(data[full:], "little"))
    h ^= len(data)
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


# ---------------------------------------------------------------------------------------------
# the noise

def test_hash_is_murmur3_of_seed_position_id():
    vectors = [(b"", 0, 0), (b"", 1, 0x514E28B7), (b"\0\0\0\0", 0, 0x2362F9DE), (b"aaaa", 0x9747B28C, 0x5A97808A),
               (b"Hello, world!", 0x9747B28C, 0x24884CBA),
               (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD)]
    assert [_murmur3_32(d, s) for d, s, _ in vectors] == [h for _, _, h in vectors], "published test vectors"
    seeds = torch.tensor([0, 1, -5, 2 ** 40 + 3, -2 ** 63, 2 ** 63 - 1])
    positions = torch.tensor([0, 7, 2 ** 33 + 1, 5, -1, 123456])
    ids = torch.tensor([0, 1, 151935, 2 ** 31 - 1])
    got = message_hash(seeds, positions, ids)
    want = [[_murmur3_32(struct.pack("<qqI", s, p, i)) for i in ids.tolist()]
            for s, p in zip(seeds.tolist(), positions.tolist())]
    assert got.tolist() == want


def test_draws_are_pure_and_vary_with_seed_and_position():
    logits = torch.zeros(1000)  # uniform: every id equally likely
    by_seed = draw(logits, 400, temperature=1.0)
    assert torch.equal(by_seed, draw(logits, 400, temperature=1.0)), "a pure function of (seed, position)"
    by_position = draw(logits, 400, temperature=1.0, seeds=torch.full((400,), 5), positions=torch.arange(400))
    by_high_word = draw(logits, 400, temperature=1.0, seeds=torch.arange(400) << 32)
    for name, tokens in (("seed", by_seed), ("position", by_position), ("seed's high word", by_high_word)):
        assert tokens.unique().numel() > 300, f"draws over the {name} are not spread: {tokens.unique().numel()}"
    assert (by_seed != by_position).float().mean() > 0.9


# ---------------------------------------------------------------------------------------------
# semantics

@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_distribution_matches_softmax(temperature):
    logits = torch.tensor([2.0, -1.0, 1.5, 0.0, 1.0, -3.0, 0.5, -0.5])
    probs = expected_probs(logits, temperature, 0, 1.0)
    ok, msg = chi_square_ok(draw(logits, 20000, temperature=temperature), probs)
    assert ok, msg
    if temperature == 1.0:  # the same row drawn at 20k positions of one request
        tokens = draw(logits, 20000, temperature=1.0, seeds=torch.full((20000,), -77), positions=torch.arange(20000))
        ok, msg = chi_square_ok(tokens, probs)
        assert ok, "over positions: " + msg


@pytest.mark.parametrize("top_k,top_p,dtype", [(3, 1.0, torch.float32), (0, 0.7, torch.float32),
                                               (3, 0.7, torch.float32), (3, 0.7, torch.bfloat16),
                                               (2, 0.5, torch.float32), (1, 1.0, torch.float32),
                                               (8, 0.1, torch.bfloat16)])
def test_top_k_top_p_distribution(top_k, top_p, dtype):
    logits = torch.tensor([2.0, -1.0, 1.5, 0.0, 1.0, -3.0, 0.5, -0.5]).to(dtype)
    probs = expected_probs(logits.float(), 1.0, top_k, top_p)
    ok, msg = chi_square_ok(draw(logits, 20000, temperature=1.0, top_k=top_k, top_p=top_p), probs)
    assert ok, f"top_k {top_k} top_p {top_p}: {msg}"


def test_filter_ties_go_to_smaller_ids():
    tied = torch.tensor([1.0, 3.0, 0.0, 3.0, 3.0, 2.0])
    tokens = draw(tied, 4000, temperature=1.0, top_k=2)  # ids 1, 3, 4 tie for two places
    assert set(tokens.tolist()) == {1, 3}
    uniform = torch.zeros(6)
    tokens = draw(uniform, 4000, temperature=1.0, top_p=0.4)  # 1/6 + 1/6 + 1/6 >= 0.4: three ids
    assert set(tokens.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_argmax_with_smallest_id(dtype):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 4, (64, 50), generator=g).to(dtype)  # many ties at the max
    logits[0] = 3.0
    n = logits.shape[0]
    tokens, logprobs = sample(logits, torch.arange(n), torch.arange(n), block=1024,
                              temperature=torch.zeros(n), top_k=torch.full((n,), 2), top_p=torch.full((n,), 0.5))
    want = torch.stack([(row == row.max()).nonzero()[0, 0] for row in logits])
    assert torch.equal(tokens, want)
    assert torch.equal(logprobs, token_logprobs(logits, want, block=1024, temperature=1.0))


@pytest.mark.parametrize("dtype,vocab,rows", [(torch.bfloat16, 151936, 8), (torch.float32, 1000, 48),
                                              (torch.bfloat16, 37, 48)])
def test_sample_matches_reference_and_token_logprobs(dtype, vocab, rows):
    inp = sampling_inputs(rows, vocab, dtype)
    _, detent = selectors(log_softmax_program, vocab=vocab)
    cfg = detent(rows)
    tokens, logprobs = sampling_run(inp, detent)(torch.arange(rows))
    ref_tokens, ref_logprobs = sample_ref(**inp)
    assert torch.equal(tokens, ref_tokens), f"rows {(tokens != ref_tokens).nonzero()[:, 0].tolist()}"
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=1e-5, atol=1e-4)
    temps = torch.where(inp["temperature"] == 0, 1.0, inp["temperature"])
    for t in temps.unique().tolist():
        r = (temps == t).nonzero()[:, 0]
        kw = {"block": cfg.block, "num_warps": cfg.num_warps, "temperature": t}
        lsm = log_softmax(inp["logits"][r], **kw).gather(1, tokens[r, None])[:, 0]
        assert torch.equal(logprobs[r], lsm), f"T={t}: the logprob must be log_softmax's bits at the token"
        assert torch.equal(logprobs[r], token_logprobs(inp["logits"][r], tokens[r], **kw))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_graph_sampler_gives_sample_bits_on_unfiltered_rows(temperature):
    # the decode graph's sampler: rows whose logprobs share one temperature (greedy ones count as T = 1),
    # no top-k/top-p
    inp = sampling_inputs(40, 1000, torch.bfloat16)
    temps = torch.where(inp["temperature"] == 0, 0.0 if temperature == 1.0 else temperature, temperature)
    off_k, off_p = torch.zeros(40, dtype=torch.int64), torch.ones(40)
    want = sample(inp["logits"], inp["seeds"], inp["positions"], temperature=temps, top_k=off_k, top_p=off_p,
                  block=256)
    got = sample_unfiltered(inp["logits"], inp["seeds"], inp["positions"], temps, temperature=temperature, block=256)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    all_greedy = torch.zeros(40)
    want = sample(inp["logits"], inp["seeds"], inp["positions"], temperature=all_greedy, top_k=off_k, top_p=off_p,
                  block=256)
    got = sample_unfiltered(inp["logits"], inp["seeds"], inp["positions"], all_greedy, temperature=1.0, block=256)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="temps must be"):
        sample_unfiltered(inp["logits"], inp["seeds"], inp["positions"], temps.double(), temperature=1.0, block=256)
    with pytest.raises(ValueError, match="finite and > 0"):
        sample_unfiltered(inp["logits"], inp["seeds"], inp["positions"], temps, temperature=0.0, block=256)


# ---------------------------------------------------------------------------------------------
# batch invariance, and the negative control

@pytest.mark.parametrize("dtype,vocab,sizes", [(torch.bfloat16, 2048, (1, 3, 64, 300)),
                                               (torch.float32, 1000, (1, 3, 64, 300)),
                                               (torch.bfloat16, 151936, (1, 3, 9))])
def test_sampling_is_batch_invariant(dtype, vocab, sizes):
    _, detent = selectors(log_softmax_program, vocab=vocab)
    probes = 6 if vocab < 10000 else 3
    inp = sampling_inputs(max(sizes) + probes, vocab, dtype)
    failures = invariance_failures(sampling_run(inp, detent), sizes, probes=probes)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


def test_views_sample_like_the_packed_batch():
    inp = sampling_inputs(24, 512, torch.bfloat16)
    run = sampling_run(inp, selectors(log_softmax_program, vocab=512)[1])
    full = run(torch.arange(24))
    as_last_position = torch.randn(24, 3, 512).to(torch.bfloat16)
    as_last_position[:, -1] = inp["logits"]
    inp["logits"] = as_last_position[:, -1]  # a strided view, as the model's last position
    got = run(torch.arange(24))
    assert torch.equal(got[0], full[0]) and torch.equal(got[1], full[1])


def test_stock_sampler_breaks_invariance():
    """Negative control: the same check on the same rows fails for a stock sampler, passes for ours."""
    inp = sampling_inputs(306, 1000, torch.float32)
    inp["logits"] = inp["logits"] / 6  # high entropy: every draw matters
    inp["temperature"] = torch.where(inp["temperature"] == 0, 1.0, inp["temperature"])

    def stock_run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (stock_sample(inp["logits"][idx], inp["temperature"][idx], step_seed=1234),)
    stock = invariance_failures(stock_run, (1, 3, 64, 300))
    assert stock, "negative control: the stock sampler gave every probe row its batch-1 token"
    _, detent = selectors(log_softmax_program, vocab=1000)
    assert invariance_failures(sampling_run(inp, detent), (1, 3, 64, 300)) == []


# ---------------------------------------------------------------------------------------------
# refusals

def test_refuses_bad_input():
    n, v = 4, 32
    ok = {"logits": torch.randn(n, v), "seeds": torch.arange(n), "positions": torch.arange(n),
          "temperature": torch.ones(n), "top_k": torch.zeros(n, dtype=torch.long), "top_p": torch.ones(n)}

    def call(**changes):
        kw = dict(ok, **changes)
        return sample(kw.pop("logits"), kw.pop("seeds"), kw.pop("positions"), block=64, **kw)
    call()
    with pytest.raises(ValueError, match="seeded sampling requires a seed per request"):
        call(seeds=None)
    with pytest.raises(TypeError, match="seeded sampling requires a seed per request"):
        call(seeds=[1, 2, 3, 4])
    cases = {"seeds": torch.arange(n).int(), "positions": torch.arange(n + 1),
             "temperature": torch.ones(n, dtype=torch.float64), "top_k": torch.zeros(n),
             "top_p": torch.ones(n, 1), "logits": torch.randn(n, v).long()}
    for name, bad in cases.items():
        with pytest.raises(ValueError, match=name):
            call(**{name: bad})
    for name, bad, msg in (("temperature", -0.5, "temperature"), ("temperature", float("nan"), "temperature"),
                           ("temperature", float("inf"), "temperature"), ("top_p", 0.0, "top_p"),
                           ("top_p", 1.5, "top_p"), ("top_k", -1, "top_k")):
        t = ok[name].clone()
        t[2] = bad
        with pytest.raises(ValueError, match=msg):
            call(**{name: t})
    with pytest.raises(ValueError, match="block"):
        sample(ok["logits"], ok["seeds"], ok["positions"], temperature=ok["temperature"], top_k=ok["top_k"],
               top_p=ok["top_p"], block=48)


# ---------------------------------------------------------------------------------------------
# the Triton kernels under the interpreter (logic only, tiny shapes)

_INTERPRETED = textwrap.dedent("""
    import torch
    from detent_rl.kernels.sampling import (_allowed, _sample, _top_p_cutoff_torch, _top_p_cutoff_triton,
                                            sample_unfiltered)
    from test_kernels_sampling import sampling_inputs
    for dt, vocab in ((torch.bfloat16, 300), (torch.float32, 77)):
        inp = sampling_inputs(12, vocab, dt)
        args = [inp[k] for k in ("logits", "seeds", "positions", "temperature", "top_k", "top_p")]
        cpu = _sample(*args, 64, 4, False)
        tri = _sample(*args, 64, 4, True)
        assert torch.equal(tri[0], cpu[0]), (tri[0] != cpu[0]).nonzero()
        assert torch.equal(tri[1], cpu[1])
        for a, b in zip(_allowed(*args[:1], *args[3:], 64, 4, True), _allowed(*args[:1], *args[3:], 64, 4, False)):
            assert torch.equal(a, b)
        alone = _sample(*[a[5:6] for a in args], 64, 4, True)
        assert alone[0][0] == tri[0][5] and torch.equal(alone[1][0], tri[1][5])
        # the graph's sampler: the argmax and the logprob partials in one pass over 5 ranges of 64 ids
        # (at 0.7 every row divides; at 1 the kernel skips the division, and its greedy rows the noise)
        for t, temps in ((0.7, torch.full_like(inp["temperature"], 0.7)),
                         (1.0, torch.tensor([0.0, 1.0]).repeat(6))):
            one = sample_unfiltered(inp["logits"], inp["seeds"], inp["positions"], temps, temperature=t, block=64)
            ref = _sample(inp["logits"], inp["seeds"], inp["positions"], temps, torch.zeros_like(inp["top_k"]),
                          torch.ones_like(inp["top_p"]), 64, 4, False)
            assert torch.equal(one[0], ref[0]) and torch.equal(one[1], ref[1])
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(9, 200, generator=g) * 2, 1).sort(1, descending=True).values
    # in-block scans differ in rounding (tl.cumsum vs Hillis-Steele): keep top_p off the tail's crumbs
    top_p = torch.tensor([0.1, 0.5, 0.9, 0.99, 0.2, 0.3, 0.7, 0.8, 0.95])
    assert torch.equal(_top_p_cutoff_triton(probs, top_p, 64, 4), _top_p_cutoff_torch(probs, top_p, 64))
    print("interpreted kernels ok")
""")


def test_triton_kernels_under_interpreter():
    proc = run_interpreted(_INTERPRETED, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
