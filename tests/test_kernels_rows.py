"""Row-wise kernels on the CPU (PyTorch paths): match their references, batch-invariant under the
detent selection, and the stock selection (block widened for small batches) visibly is not.

The Triton kernels also run here once, under TRITON_INTERPRET=1 on tiny shapes, for correctness
only: the interpreter proves nothing about GPU bits (and it rounds fp32 -> bf16 toward zero).
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from detent_rl.kernels._triton import fold_rows
from detent_rl.kernels.embedding import embedding, embedding_ref
from detent_rl.kernels.log_softmax import log_softmax, log_softmax_ref, token_logprobs, token_logprobs_ref
from detent_rl.kernels.rmsnorm import rmsnorm, rmsnorm_ref
from detent_rl.kernels.rotary import apply_rotary, apply_rotary_ref, rope_cos_sin, rope_inv_freq, rotary_store
from detent_rl.kernels.programs.rows import elementwise_program
from detent_rl.kernels.programs.rows import log_softmax_program
from detent_rl.kernels.programs.rows import rmsnorm_program
from detent_rl.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref
from detent_rl.kernels.vocab import MAX_SPLITS, max_logsumexp_torch, num_splits, vocab_split
from detent_rl.selir.cache import JITCache
from detent_rl.selir.solver import solve
from rows_cases import (DTYPES, EPS, EXACT_TOL, LOGPROB_TOL, MAX_ROWS, TOL, _bits, _hf_configs, alone_vs_batch,
                        invariance_failures, log_softmax_run, logits_inputs, rmsnorm_inputs, rmsnorm_run,
                        rotary_store_case, rotary_store_failures, rstd_witness_rows, selectors)


# ---------------------------------------------------------------------------------------------
# harness (shared with test_kernels_rows_gpu.py)


# ---------------------------------------------------------------------------------------------
# RMSNorm


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden", [896, 1000, 4096])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_matches_reference(dtype, hidden, residual):
    x, w, res = rmsnorm_inputs(37, hidden, dtype)
    res = res if residual else None
    for block in (128, 256, 1024, 4096):
        got = rmsnorm(x, w, EPS, block=block, residual=res)
        ref = rmsnorm_ref(x, w, EPS, residual=res)
        if residual:
            assert torch.equal(got[1], ref[1]), "the new residual is x + residual, exactly"
            got, ref = got[0], ref[0]
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, msg=lambda m: f"block {block}: {m}")


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden", [896, 1000, 4096])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_detent_is_batch_invariant(dtype, hidden, residual):
    _, detent = selectors(rmsnorm_program, hidden=hidden)
    x, w, res = rmsnorm_inputs(1006, hidden, dtype)
    failures = invariance_failures(rmsnorm_run(x, w, res if residual else None, detent), (1, 3, 64, 300, 1000))
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_stock_selection_breaks_invariance(dtype, residual):
    hidden = 896
    stock, detent = selectors(rmsnorm_program, hidden=hidden)
    assert stock(1).block != stock(512).block, "stock must read the batch"
    x, w, res = rmsnorm_inputs(512, hidden, dtype)
    if dtype == torch.bfloat16:  # random bf16 rows almost never show it (see rstd_witness_rows)
        x, w = rstd_witness_rows(512, hidden), torch.ones_like(w)
    if residual:  # h = x/2 + x/2 = x exactly, so the witness rows survive the residual add
        x = x / 2
        res = x.clone()
    else:
        res = None
    assert alone_vs_batch(rmsnorm_run(x, w, res, detent), 512) == []
    stock_bad = alone_vs_batch(rmsnorm_run(x, w, res, stock), 512)
    assert stock_bad, "negative control: stock selection (block 1024 alone, 256 in a batch of 512) changed no row"


# ---------------------------------------------------------------------------------------------
# log-softmax and token logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab", [151936, 1000, 32])
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_matches_reference(dtype, vocab, temperature):
    logits, ids = logits_inputs(9, vocab, dtype)
    for block in (128, 1024, 4096):
        got = log_softmax(logits, block=block, temperature=temperature)
        ref = log_softmax_ref(logits, temperature=temperature)
        torch.testing.assert_close(got, ref, rtol=LOGPROB_TOL[0], atol=LOGPROB_TOL[1])
        scaled = logits.float() / torch.tensor(temperature, dtype=torch.float32, device=logits.device)
        exact = torch.log_softmax(scaled.double(), dim=-1)
        torch.testing.assert_close(got.double(), exact, rtol=EXACT_TOL[0], atol=EXACT_TOL[1])
        tok = token_logprobs(logits, ids, block=block, temperature=temperature)
        assert torch.equal(_bits(tok[:, None]), _bits(got.gather(1, ids[:, None]))), \
            "token_logprobs must equal log_softmax at the token, bit for bit"
        torch.testing.assert_close(tok, token_logprobs_ref(logits, ids, temperature=temperature),
                                   rtol=LOGPROB_TOL[0], atol=LOGPROB_TOL[1])


@pytest.mark.parametrize("dtype,vocab", [(torch.bfloat16, 151936), (torch.float32, 1000)])
def test_log_softmax_detent_is_batch_invariant(dtype, vocab):
    _, detent = selectors(log_softmax_program, vocab=vocab)
    logits, ids = logits_inputs(306, vocab, dtype)
    failures = invariance_failures(log_softmax_run(logits, ids, detent, 0.7), (1, 3, 64, 300))
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_stock_selection_breaks_invariance(dtype):
    vocab = 32000
    stock, detent = selectors(log_softmax_program, vocab=vocab)
    assert stock(1).block != stock(512).block, "stock must read the batch"
    logits, ids = logits_inputs(512, vocab, dtype)  # a batch of 512 rows; every 8th row also alone
    assert alone_vs_batch(log_softmax_run(logits, ids, detent), 512, every=8) == []
    assert alone_vs_batch(log_softmax_run(logits, ids, stock), 512, every=8), \
        "negative control: stock selection (block 4096 alone, 1024 in a batch of 512) changed no row"


@pytest.mark.parametrize("vocab,block", [(37, 16), (1000, 16), (151936, 1024), (151936, 4096), (10 ** 6, 128)])
def test_vocab_ranges_cover_the_row_in_whole_blocks(vocab, block):
    split, n = vocab_split(vocab, block), num_splits(vocab, block)
    assert split % block == 0 and 1 <= n <= MAX_SPLITS
    assert (n - 1) * split < vocab <= n * split


def test_one_vocab_range_is_the_whole_row_formula_and_a_masked_range_adds_nothing():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 1000, generator=g) * 3
    big, lse = max_logsumexp_torch(x, 1024)  # 1,000 ids in one range of 1,024
    m = fold_rows(x, 1024, float("-inf"), lambda p: p, torch.maximum, float("-inf"))
    s = fold_rows(x, 1024, float("-inf"), lambda p: torch.exp(p - m[:, None]), torch.add, 0.0)
    assert torch.equal(big, m) and torch.equal(lse, torch.log(s)), "one range must be the old formula's bits"
    x[:, :500] = float("-inf")  # top-k's mask: whole ranges of -inf (63 ranges of 16 ids)
    out = log_softmax(x, block=16)
    assert torch.isfinite(out[:, 500:]).all() and (out[:, :500] == float("-inf")).all()
    torch.testing.assert_close(out[:, 500:], torch.log_softmax(x[:, 500:].double(), 1).float(), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# elementwise families: SiLU-and-mul, rotary, embedding

@pytest.mark.parametrize("width", [128, 896, 1000, 4864, 151936])
def test_elementwise_selection_reads_no_batch(width):
    sol = solve(elementwise_program, {"width": width, "max_rows": MAX_ROWS}, cache=JITCache(enabled=False))
    assert sol.stats["batch_dependent_points"] == ()
    stock, detent = sol.stock(), sol.commit()
    assert {stock(n) for n in (1, 3, 255, 256, 257, 8192)} == {detent(1)}


@pytest.mark.parametrize("d", [896, 1000, 4864])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference_and_is_invariant(dtype, d):
    _, detent = selectors(elementwise_program, width=d)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1006, 2 * d, generator=g) * 3).to(dtype)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(silu_and_mul(x[:50], block=detent(50).block), silu_and_mul_ref(x[:50]),
                               rtol=rtol, atol=atol)

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (silu_and_mul(x[idx], block=detent(idx.numel()).block),)
    failures = invariance_failures(run, (1, 3, 64, 300, 1000))
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_table_is_hf_rotary_embedding(dtype):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    positions = torch.arange(3000)
    for name, cfg in _hf_configs().items():
        cos, sin = rope_cos_sin(cfg, 3000, "cpu", dtype)
        hf_cos, hf_sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1, dtype=dtype), positions[None])
        assert torch.equal(cos, hf_cos[0]) and torch.equal(sin, hf_sin[0]), f"rope type {name}"


def test_rope_refuses_sequence_dependent_types():
    from transformers import LlamaConfig
    half = 64
    for params in ({"rope_type": "dynamic", "factor": 2.0},
                   {"rope_type": "longrope", "long_factor": [1.0] * half, "short_factor": [1.0] * half,
                    "original_max_position_embeddings": 256}):
        cfg = LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=1024,
                          rope_parameters=dict(params, rope_theta=10000.0))
        with pytest.raises(ValueError, match="sequence length"):
            rope_inv_freq(cfg)


@pytest.mark.parametrize("rotary_dim", [64, 32])  # full and partial rotary (head_dim 64)
@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rotary_is_hf_and_invariant(dtype, rotary_dim):
    heads, kv_heads, head_dim, max_pos = 14, 2, 64, 4096
    cos, sin = rope_cos_sin(_hf_configs()["default"], max_pos, "cpu", dtype)
    cos, sin = cos[:, :rotary_dim].contiguous(), sin[:, :rotary_dim].contiguous()
    if rotary_dim < head_dim:  # a table built for rotary_dim: both halves carry the same frequencies
        cos, sin = torch.cat([cos[:, :rotary_dim // 2]] * 2, 1), torch.cat([sin[:, :rotary_dim // 2]] * 2, 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1006, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(1006, kv_heads, head_dim, generator=g).to(dtype)
    pos = torch.randint(0, max_pos, (1006,), generator=g)
    _, detent = selectors(elementwise_program, width=heads * head_dim)
    got = apply_rotary(q[:40], k[:40], pos[:40], cos, sin, block=detent(40).block)
    ref = apply_rotary_ref(q[:40], k[:40], pos[:40], cos, sin)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), "same ops as HF, same bits"

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return apply_rotary(q[idx], k[idx], pos[idx], cos, sin, block=detent(idx.numel()).block)
    failures = invariance_failures(run, (1, 3, 64, 300, 1000))
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("rotary_dim", [64, 32])  # full and partial rotary (head_dim 64)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_store_is_apply_rotary_then_store_kv(dtype, rotary_dim, slot_dtype):
    _, detent = selectors(elementwise_program, width=14 * 64)
    for tokens, pad in ((1, 0), (37, 5)):  # a decode row; a batch with the graph's padding rows
        case = rotary_store_case(tokens, 14, 2, 64, rotary_dim, dtype, pad=pad)
        case["slots"] = case["slots"].to(slot_dtype)
        block = detent(tokens).block
        fused = functools.partial(rotary_store, block=block)
        unfused = functools.partial(apply_rotary, block=block)
        failures = rotary_store_failures(case, fused, unfused)
        assert not failures, "\n".join(failures)
        assert rotary_store_failures(case, fused, lambda q, k, *_: (q, k)), "negative control: no rotation"


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_matches_reference_and_is_invariant(dtype):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(5000, 896, generator=g).to(dtype)
    ids = torch.randint(0, 5000, (1006,), generator=g)
    _, detent = selectors(elementwise_program, width=896)
    assert torch.equal(embedding(ids[:50].int(), weight, block=detent(50).block), embedding_ref(ids[:50], weight))

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (embedding(ids[idx], weight, block=detent(idx.numel()).block),)
    failures = invariance_failures(run, (1, 3, 64, 300, 1000))
    assert not failures, "\n".join(failures[:20])


# ---------------------------------------------------------------------------------------------
# the Triton kernels under the interpreter (correctness on tiny shapes only)

_INTERPRETED = textwrap.dedent("""
    import torch
    from detent_rl.kernels.rmsnorm import _rmsnorm_triton, resident_blocks, rmsnorm_ref
    from detent_rl.kernels.log_softmax import _log_softmax_triton, _token_logprobs_triton, log_softmax_ref
    from detent_rl.kernels.silu_and_mul import _silu_and_mul_triton, silu_and_mul_ref
    from detent_rl.kernels.rotary import _rotary_store_triton, _rotary_triton, _rotary_torch
    from rows_cases import rotary_store_case, rotary_store_failures
    from detent_rl.kernels.embedding import _embedding_triton
    g = torch.Generator().manual_seed(0)
    # the interpreter rounds fp32 -> bf16 toward zero, so bf16 is compared to within two bf16 steps
    tol = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2 ** -6, atol=2 ** -6)}
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(5, 200, generator=g).to(dt)
        w = torch.randn(200, generator=g).to(dt)
        r = torch.randn(5, 200, generator=g).to(dt)
        out, res = _rmsnorm_triton(x, w, 1e-6, r, 64, 4)
        ref, ref_res = rmsnorm_ref(x, w, 1e-6, residual=r)
        torch.testing.assert_close(out, ref, **tol[dt])
        torch.testing.assert_close(res, ref_res, **tol[dt])
        one, _ = _rmsnorm_triton(x[3:4], w, 1e-6, r[3:4], 64, 4)
        assert torch.equal(one[0], out[3]), "rmsnorm row 3 alone"
        # a 16-bit row in one or two blocks held in registers between the passes: the loops' bits (and residual
        # sums); an fp32 row takes the loops (`resident_blocks`)
        for block in (256, 128):
            assert resident_blocks(200, block, x.element_size()) == (0 if dt == torch.float32 else -(-200 // block))
            for res in (r, None):
                held = _rmsnorm_triton(x, w, 1e-6, res, block, 4)
                loops = _rmsnorm_triton(x, w, 1e-6, res, block, 4, resident=0)
                assert torch.equal(held[0], loops[0]) and (res is None or torch.equal(held[1], loops[1])), block
        logits = (torch.randn(4, 300, generator=g) * 4).to(dt)
        ids = torch.randint(0, 300, (4,), generator=g)
        for temp in (1.0, 0.7):
            lsm = _log_softmax_triton(logits, 64, 4, temp)
            torch.testing.assert_close(lsm, log_softmax_ref(logits, temperature=temp), rtol=1e-5, atol=2e-5)
            tok = _token_logprobs_triton(logits, ids, 64, 4, temp)
            assert torch.equal(tok, lsm[torch.arange(4), ids]), "token_logprobs == log_softmax[token]"
            assert torch.equal(_log_softmax_triton(logits[2:3], 64, 4, temp)[0], lsm[2]), "lsm row 2 alone"
        xm = (torch.randn(3, 2 * 100, generator=g) * 3).to(dt)
        torch.testing.assert_close(_silu_and_mul_triton(xm, 64), silu_and_mul_ref(xm), **tol[dt])
        cos = torch.randn(64, 32, generator=g).to(dt)
        sin = torch.randn(64, 32, generator=g).to(dt)
        q = torch.randn(6, 3, 48, generator=g).to(dt)  # partial rotary: 32 of 48 dims
        pos = torch.randint(0, 64, (6,), generator=g)
        torch.testing.assert_close(_rotary_triton(q, pos, cos, sin, 32), _rotary_torch(q, pos, cos, sin), **tol[dt])
        for rot in (48, 32):  # rotary + k/v store in one kernel == the rotary kernel then store_kv, bit for bit
            case = rotary_store_case(9, 3, 2, 48, rot, dt, page_size=4)
            failures = rotary_store_failures(case, lambda *a: _rotary_store_triton(*a, 32),
                                             lambda q, k, *a: (_rotary_triton(q, *a, 32), _rotary_triton(k, *a, 32)))
            assert not failures, failures
        emb_w = torch.randn(50, 100, generator=g).to(dt)
        emb_ids = torch.randint(0, 50, (7,), generator=g)
        assert torch.equal(_embedding_triton(emb_ids, emb_w, 64), emb_w[emb_ids])
    print("interpreted kernels ok")
""")


def test_triton_kernels_under_interpreter(tmp_path):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])  # rows_cases
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
