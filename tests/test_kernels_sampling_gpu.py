"""Seeded sampling on CUDA (Triton): the GPU noise is the documented hash, draws follow the
filtered softmax, greedy and tie rules hold, the logprob is log_softmax's bits at the token, and
(token, logprob) of a row is the same alone and at any slot of batches up to 512 at vocab 151,936;
a stock sampler (global seed per step, torch.multinomial over the batch) visibly is not.
Run on the device with `python -m pytest -q -m gpu tests/test_kernels_sampling_gpu.py`.
"""
from __future__ import annotations

import pytest
import torch

from detent_rl.kernels.log_softmax import log_softmax, token_logprobs
from detent_rl.kernels.noise import gumbel_noise
from detent_rl.kernels.sampling import _top_p_cutoff_triton, sample, sample_ref
from detent_rl.kernels.programs.rows import log_softmax_program
from test_kernels_rows import invariance_failures, selectors
from test_kernels_sampling import (chi_square_ok, draw, expected_probs, sampling_inputs, sampling_run,
                                   stock_sample)

pytestmark = pytest.mark.gpu

DEV = "cuda"
VOCAB = 151936
SIZES = (1, 3, 64, 300, 512)
DTYPES = [torch.bfloat16, torch.float32]
NEAR = 1e-5  # relative: tl.log and torch.log may differ by an ulp or two in the noise
MASS = 1e-4  # absolute: fp32 top-p sums over 151,936 ids against float64 ones


def _check(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


def _unexplained(inp: dict, tokens: torch.Tensor, ref: torch.Tensor) -> list[str]:
    """Rows where the Triton token differs from the reference's beyond a near-tie of fp32 noise.

    A near tie: the two tokens' perturbed scores within NEAR, or either token's exclusive top-p
    mass within MASS of top_p (the reference sums with torch.cumsum, the kernel with its scan).
    """
    out = []
    for r in (tokens != ref).nonzero()[:, 0].tolist():
        logits, t = inp["logits"][r].float(), inp["temperature"][r].item()
        pair = torch.stack([tokens[r], ref[r]])
        if t == 0:
            out.append(f"row {r}: greedy {pair.tolist()}")
            continue
        x = logits / inp["temperature"][r]
        scores = x[pair] + gumbel_noise(inp["seeds"][r:r + 1], inp["positions"][r:r + 1], pair)[0]
        if (scores[0] - scores[1]).abs() <= NEAR * max(1.0, scores.abs().max().item()):
            continue
        k, p = int(inp["top_k"][r]), inp["top_p"][r].item()
        if 0 < k < x.numel():
            x[torch.sort(logits, descending=True, stable=True).indices[k:]] = float("-inf")
        probs, order = torch.sort(torch.softmax(x.double(), 0), descending=True, stable=True)
        before = (torch.cumsum(probs, 0) - probs)[torch.argsort(order)][pair]
        if p < 1.0 and ((before - p).abs() <= MASS).any():
            continue
        out.append(f"row {r}: tokens {pair.tolist()}, scores {scores.tolist()}, mass ahead {before.tolist()}, "
                   f"T {t} top_k {k} top_p {p}")
    return out


@pytest.mark.parametrize("vocab", [VOCAB, 32000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_matches_reference_and_log_softmax(dtype, vocab):
    rows = 256
    inp = sampling_inputs(rows, vocab, dtype, DEV)
    _, detent = selectors(log_softmax_program, vocab=vocab)
    cfg = detent(rows)
    tokens, logprobs = sampling_run(inp, detent)(torch.arange(rows))
    ref_tokens, ref_logprobs = sample_ref(**inp)
    bad = _unexplained(inp, tokens, ref_tokens)
    assert not bad and (tokens != ref_tokens).sum() <= rows // 50, "\n".join(bad[:20])
    same = tokens == ref_tokens
    torch.testing.assert_close(logprobs[same], ref_logprobs[same], rtol=1e-5, atol=1e-4)
    temps = torch.where(inp["temperature"] == 0, 1.0, inp["temperature"])
    for t in temps.unique().tolist():
        r = (temps == t).nonzero()[:, 0]
        kw = {"block": cfg.block, "num_warps": cfg.num_warps, "temperature": t}
        lsm = log_softmax(inp["logits"][r], **kw).gather(1, tokens[r, None])[:, 0]
        assert torch.equal(logprobs[r], lsm), f"T={t}: not log_softmax's bits at the token"
        assert torch.equal(logprobs[r], token_logprobs(inp["logits"][r], tokens[r], **kw))


def test_noise_is_the_documented_hash():
    """Uniform logits: the token is the argmax of the noise alone, computed here on the CPU."""
    rows = 128
    g = torch.Generator().manual_seed(3)
    seeds = torch.randint(-2 ** 63, 2 ** 63 - 1, (rows,), generator=g)
    positions = torch.randint(0, 1 << 40, (rows,), generator=g)
    tokens, _ = sample(torch.zeros(rows, VOCAB, device=DEV), seeds.to(DEV), positions.to(DEV), block=1024,
                       temperature=torch.ones(rows, device=DEV), top_k=torch.zeros(rows, dtype=torch.long, device=DEV),
                       top_p=torch.ones(rows, device=DEV))
    noise = gumbel_noise(seeds, positions, torch.arange(VOCAB))
    top2 = noise.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > NEAR * top2[:, 0].abs().clamp(min=1)
    want = noise.argmax(1)
    assert clear.sum() >= rows - 2
    assert torch.equal(tokens.cpu()[clear], want[clear]), f"{(tokens.cpu() != want)[clear].sum()} rows differ"


@pytest.mark.parametrize("dtype", DTYPES)
def test_sampling_is_batch_invariant(dtype):
    _, detent = selectors(log_softmax_program, vocab=VOCAB)
    inp = sampling_inputs(max(SIZES) + 6, VOCAB, dtype, DEV)
    _check(invariance_failures(sampling_run(inp, detent), SIZES))


def test_views_sample_like_the_packed_batch():
    inp = sampling_inputs(64, VOCAB, torch.bfloat16, DEV)
    run = sampling_run(inp, selectors(log_softmax_program, vocab=VOCAB)[1])
    full = run(torch.arange(64))
    as_last_position = torch.randn(64, 2, VOCAB, device=DEV).to(torch.bfloat16)
    as_last_position[:, -1] = inp["logits"]
    inp["logits"] = as_last_position[:, -1]
    got = run(torch.arange(64))
    assert torch.equal(got[0], full[0]) and torch.equal(got[1], full[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_is_argmax_with_smallest_id(dtype):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-30, 31, (300, VOCAB), generator=g).to(dtype).to(DEV)  # thousands of ties at the max
    n = logits.shape[0]
    tokens, _ = sample(logits, torch.arange(n, device=DEV), torch.arange(n, device=DEV), block=1024,
                       temperature=torch.zeros(n, device=DEV), top_k=torch.full((n,), 2, device=DEV),
                       top_p=torch.full((n,), 0.5, device=DEV))
    ids = torch.arange(VOCAB, device=DEV)
    want = torch.where(logits == logits.max(1, keepdim=True).values, ids, VOCAB).amin(1)  # first maximal id
    assert torch.equal(tokens, want)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_distribution_matches_softmax(temperature):
    logits = torch.tensor([2.0, -1.0, 1.5, 0.0, 1.0, -3.0, 0.5, -0.5], device=DEV)
    ok, msg = chi_square_ok(draw(logits, 20000, temperature=temperature), expected_probs(logits, temperature, 0, 1.0))
    assert ok, msg


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.7), (3, 0.7), (2, 0.5), (8, 0.1)])
def test_top_k_top_p_distribution(top_k, top_p):
    logits = torch.tensor([2.0, -1.0, 1.5, 0.0, 1.0, -3.0, 0.5, -0.5], device=DEV)
    ok, msg = chi_square_ok(draw(logits, 20000, temperature=1.0, top_k=top_k, top_p=top_p),
                            expected_probs(logits, 1.0, top_k, top_p))
    assert ok, f"top_k {top_k} top_p {top_p}: {msg}"


def test_filter_ties_go_to_smaller_ids():
    tied = torch.tensor([1.0, 3.0, 0.0, 3.0, 3.0, 2.0], device=DEV)
    assert set(draw(tied, 4000, temperature=1.0, top_k=2).tolist()) == {1, 3}
    assert set(draw(torch.zeros(6, device=DEV), 4000, temperature=1.0, top_p=0.4).tolist()) == {0, 1, 2}


def test_top_p_scan_crosses_where_the_exact_sum_does():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, VOCAB, generator=g) * 3, 1).sort(1, descending=True).values
    top_p = torch.rand(64, generator=g) * 0.98 + 0.01
    first = _top_p_cutoff_triton(probs.to(DEV), top_p.to(DEV), 1024, 4).cpu()
    assert (first < VOCAB).all(), "every top_p < 0.99 is reached"
    cum = torch.cumsum(probs.double(), 1)
    at = cum.gather(1, first[:, None])[:, 0]
    ahead = torch.where(first > 0, cum.gather(1, (first - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    assert ((at >= top_p.double() - MASS) & (ahead < top_p.double() + MASS)).all()


def test_stock_sampler_breaks_invariance():
    """Negative control: the same check on the same rows fails for a stock sampler, passes for ours."""
    inp = sampling_inputs(max(SIZES) + 6, VOCAB, torch.float32, DEV)
    inp["logits"] = inp["logits"] / 6  # high entropy: every draw matters
    inp["temperature"] = torch.where(inp["temperature"] == 0, 1.0, inp["temperature"])

    def stock_run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        i = idx.to(DEV)
        return (stock_sample(inp["logits"][i], inp["temperature"][i], step_seed=1234),)
    assert invariance_failures(stock_run, SIZES), \
        "negative control: the stock sampler gave every probe row its batch-1 token"
    _, detent = selectors(log_softmax_program, vocab=VOCAB)
    _check(invariance_failures(sampling_run(inp, detent), SIZES))
