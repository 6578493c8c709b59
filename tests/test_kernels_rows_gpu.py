"""Row-wise Triton kernels on CUDA: match their references, batch-invariant under the detent
selection at realistic sizes, and the stock selection visibly is not. Run on the device with
`python -m pytest -q -m gpu tests/test_kernels_rows_gpu.py`.
"""
from __future__ import annotations

import functools

import pytest
import torch

from detent_rl.kernels.embedding import embedding, embedding_ref
from detent_rl.kernels.log_softmax import log_softmax, log_softmax_ref, token_logprobs, token_logprobs_ref
from detent_rl.kernels.rmsnorm import rmsnorm, rmsnorm_ref
from detent_rl.kernels.rotary import apply_rotary, apply_rotary_ref, rope_cos_sin, rotary_store
from detent_rl.kernels.programs.rows import elementwise_program
from detent_rl.kernels.programs.rows import log_softmax_program
from detent_rl.kernels.programs.rows import rmsnorm_program
from detent_rl.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref
from rows_cases import (DTYPES, EPS, LOGPROB_TOL, TOL, _bits, _hf_configs, alone_vs_batch,
                               invariance_failures, log_softmax_run, logits_inputs, rmsnorm_inputs,
                               rmsnorm_run, rotary_store_case, rotary_store_failures, row_mismatches,
                               rstd_witness_rows, selectors)

pytestmark = pytest.mark.gpu

DEV = "cuda"
HIDDENS = [896, 2048, 4096]
SIZES = (1, 3, 64, 300, 2048)
VOCAB = 151936


def _check(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------------------------------------
# RMSNorm

@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_matches_reference(dtype, hidden, residual):
    x, w, res = rmsnorm_inputs(257, hidden, dtype, DEV)
    res = res if residual else None
    for block, num_warps in ((256, 4), (1024, 4), (4096, 8)):
        got = rmsnorm(x, w, EPS, block=block, num_warps=num_warps, residual=res)
        ref = rmsnorm_ref(x, w, EPS, residual=res)
        if residual:
            assert torch.equal(got[1], ref[1]), "the new residual is x + residual, exactly"
            got, ref = got[0], ref[0]
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, msg=lambda m: f"block {block}: {m}")


@pytest.mark.parametrize("hidden", [896, 1536, 1001, 2048])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_resident_row_keeps_the_loops_bits(dtype, hidden):
    """A row of one or two blocks of bf16 held in registers between the kernel's passes (`rmsnorm.resident_blocks`:
    the 0.5B's 896 in one 1,024-wide block, the 1.5B's 1,536 in two) gives the loops' bits, the residual sum too,
    at every row count; a row of three blocks takes the loops. fp32 rows always take the loops: their squares
    round, the compiler fuses a held row's squares into the sum, and this test's fp32 arm failed at every width
    on an H100 while the rows were held (session 55). Control: another block rounds some fp32 row differently."""
    from detent_rl.kernels.rmsnorm import _rmsnorm_triton, resident_blocks
    x, w, res = rmsnorm_inputs(300, hidden, dtype, DEV)
    bad = []
    for block, num_warps in ((1024, 4), (512, 4), (2048, 8)):
        held = resident_blocks(hidden, block, x.element_size())
        blocks = -(-hidden // block)
        assert held == (0 if dtype == torch.float32 or blocks > 2 else blocks), block
        for r in (res, None):
            for rows in (1, 7, 300):
                a = _rmsnorm_triton(x[:rows], w, EPS, None if r is None else r[:rows], block, num_warps)
                b = _rmsnorm_triton(x[:rows], w, EPS, None if r is None else r[:rows], block, num_warps, resident=0)
                if not torch.equal(a[0], b[0]) or (r is not None and not torch.equal(a[1], b[1])):
                    bad.append(f"block {block} (resident {held}) residual {r is not None} rows {rows}")
    _check(bad)
    if dtype == torch.float32:  # (fp32 outputs show any change of rstd)
        one = _rmsnorm_triton(x, w, EPS, None, 1024, 4)[0]
        assert not torch.equal(one, _rmsnorm_triton(x, w, EPS, None, 256, 4)[0]), "the block must change some bits"


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_detent_is_batch_invariant(dtype, hidden, residual):
    _, detent = selectors(rmsnorm_program, hidden=hidden)
    x, w, res = rmsnorm_inputs(max(SIZES) + 6, hidden, dtype, DEV)
    _check(invariance_failures(rmsnorm_run(x, w, res if residual else None, detent), SIZES))


@pytest.mark.parametrize("hidden", [896, 1001])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_views_match_the_batch(dtype, hidden):
    """Rows passed as views (unaligned when hidden is odd) give the bits of the packed batch."""
    _, detent = selectors(rmsnorm_program, hidden=hidden)
    x, w, _ = rmsnorm_inputs(64, hidden, dtype, DEV)
    cfg = detent(64)
    full = rmsnorm(x, w, EPS, block=cfg.block, num_warps=cfg.num_warps)
    failures = []
    for start, n in ((0, 1), (1, 1), (3, 5), (7, 20), (33, 31)):
        cfg = detent(n)
        part = rmsnorm(x[start:start + n], w, EPS, block=cfg.block, num_warps=cfg.num_warps)
        failures += [f"view [{start}:{start + n}] row {r}" for r in row_mismatches(part, full[start:start + n])]
    strided = torch.zeros(64, hidden + 3, dtype=dtype, device=DEV)[:, :hidden]
    strided.copy_(x)
    got = rmsnorm(strided, w, EPS, block=cfg.block, num_warps=cfg.num_warps)
    failures += [f"strided row {r}" for r in row_mismatches(got, full)]
    _check(failures)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_stock_selection_breaks_invariance(dtype, residual):
    hidden = 896
    stock, detent = selectors(rmsnorm_program, hidden=hidden)
    assert stock(1).block != stock(512).block, "stock must read the batch"
    stock_bad: list[int] = []
    for seed in range(4):  # bf16 witness rows expose the association in ~1% of rows: try 4 x 512
        x, w, res = rmsnorm_inputs(512, hidden, dtype, DEV, seed=seed)
        if dtype == torch.bfloat16:
            x, w = rstd_witness_rows(512, hidden, seed=seed).to(DEV), torch.ones_like(w)
        if residual:  # h = x/2 + x/2 = x exactly
            x = x / 2
            res = x.clone()
        else:
            res = None
        assert alone_vs_batch(rmsnorm_run(x, w, res, detent), 512) == []
        stock_bad += alone_vs_batch(rmsnorm_run(x, w, res, stock), 512)
        if stock_bad:
            break
    assert stock_bad, "negative control: stock selection (block 1024 alone, 256 in a batch of 512) changed no row"


# ---------------------------------------------------------------------------------------------
# log-softmax and token logprobs

@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab", [VOCAB, 32000, 1000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_matches_reference(dtype, vocab, temperature):
    logits, ids = logits_inputs(33, vocab, dtype, DEV)
    for block, num_warps in ((1024, 4), (4096, 8), (256, 4)):
        kw = dict(block=block, num_warps=num_warps, temperature=temperature)
        got = log_softmax(logits, **kw)
        torch.testing.assert_close(got, log_softmax_ref(logits, temperature=temperature),
                                   rtol=LOGPROB_TOL[0], atol=LOGPROB_TOL[1])
        tok = token_logprobs(logits, ids, **kw)
        assert torch.equal(_bits(tok[:, None]), _bits(got.gather(1, ids[:, None]))), \
            f"block {block}: token_logprobs must equal log_softmax at the token, bit for bit"
        torch.testing.assert_close(tok, token_logprobs_ref(logits, ids, temperature=temperature),
                                   rtol=LOGPROB_TOL[0], atol=LOGPROB_TOL[1])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_detent_is_batch_invariant(dtype, temperature):
    _, detent = selectors(log_softmax_program, vocab=VOCAB)
    logits, ids = logits_inputs(max(SIZES) + 6, VOCAB, dtype, DEV)
    _check(invariance_failures(log_softmax_run(logits, ids, detent, temperature), SIZES))


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_stock_selection_breaks_invariance(dtype):
    stock, detent = selectors(log_softmax_program, vocab=VOCAB)
    assert stock(1).block != stock(512).block, "stock must read the batch"
    logits, ids = logits_inputs(512, VOCAB, dtype, DEV)
    assert alone_vs_batch(log_softmax_run(logits, ids, detent), 512) == []
    assert alone_vs_batch(log_softmax_run(logits, ids, stock), 512), \
        "negative control: stock selection (block 4096 alone, 1024 in a batch of 512) changed no row"


# ---------------------------------------------------------------------------------------------
# elementwise families

@pytest.mark.parametrize("d", [4864, 1000, 11008])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype, d):
    _, detent = selectors(elementwise_program, width=d)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(max(SIZES) + 6, 2 * d, generator=g) * 3).to(dtype).to(DEV)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(silu_and_mul(x[:100], block=detent(100).block), silu_and_mul_ref(x[:100]),
                               rtol=rtol, atol=atol)

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (silu_and_mul(x[idx.to(DEV)], block=detent(idx.numel()).block),)
    _check(invariance_failures(run, SIZES))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_table_is_hf_rotary_embedding(dtype):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    positions = torch.arange(8192, device=DEV)
    for name, cfg in _hf_configs().items():
        cos, sin = rope_cos_sin(cfg, 8192, DEV, dtype)
        hf_cos, hf_sin = LlamaRotaryEmbedding(cfg).to(DEV)(torch.zeros(1, dtype=dtype, device=DEV), positions[None])
        assert torch.equal(cos, hf_cos[0]) and torch.equal(sin, hf_sin[0]), f"rope type {name}"


@pytest.mark.parametrize("rotary_dim", [128, 64])  # full and partial rotary (head_dim 128)
@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rotary(dtype, rotary_dim):
    from transformers import Qwen2Config
    heads, kv_heads, head_dim, max_pos = 16, 8, 128, 32768
    cfg = Qwen2Config(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    cos, sin = rope_cos_sin(cfg, max_pos, DEV, dtype)  # [max_pos, head_dim]
    if rotary_dim < head_dim:  # a rotate-half table of rotary_dim: both halves share frequencies
        cos, sin = (torch.cat([t[:, :rotary_dim // 2]] * 2, 1).contiguous() for t in (cos, sin))
    g = torch.Generator().manual_seed(0)
    tokens = max(SIZES) + 6
    # q and k as views of one fused qkv projection output, as the model passes them
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype).to(DEV)
    q = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    pos = torch.randint(0, max_pos, (tokens,), generator=g).to(DEV)
    _, detent = selectors(elementwise_program, width=heads * head_dim)
    got = apply_rotary(q[:200], k[:200], pos[:200], cos, sin, block=detent(200).block)
    ref = apply_rotary_ref(q[:200], k[:200], pos[:200], cos, sin)
    # same roundings as HF's eager ops (products and sum each rounded to the dtype, no FMA)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), \
        f"max |d| q {(got[0].float() - ref[0].float()).abs().max().item()}"

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        i = idx.to(DEV)
        return apply_rotary(q[i], k[i], pos[i], cos, sin, block=detent(idx.numel()).block)
    _check(invariance_failures(run, SIZES))


@pytest.mark.parametrize("tokens", [1, 32, 300])  # decode at batch 1 and 32 (the profiled steps), a prefill
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(14, 2, 64), (16, 8, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_store_is_apply_rotary_then_store_kv(dtype, heads, kv_heads, head_dim, partial, tokens):
    # one launch == the two rotary launches then store_kv, bit for bit: the new q and both whole caches
    _, detent = selectors(elementwise_program, width=heads * head_dim)
    block = detent(tokens).block
    for slot_dtype in (torch.int64, torch.int32):
        case = rotary_store_case(tokens, heads, kv_heads, head_dim, head_dim // 2 if partial else head_dim, dtype,
                                 DEV, pad=min(3, tokens - 1))
        case["slots"] = case["slots"].to(slot_dtype)
        _check(rotary_store_failures(case, functools.partial(rotary_store, block=block),
                                     functools.partial(apply_rotary, block=block)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(dtype):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, 896, generator=g).to(dtype).to(DEV)
    ids = torch.randint(0, VOCAB, (max(SIZES) + 6,), generator=g).to(DEV)
    _, detent = selectors(elementwise_program, width=896)
    assert torch.equal(embedding(ids.int(), weight, block=detent(50).block), embedding_ref(ids, weight))

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (embedding(ids[idx.to(DEV)], weight, block=detent(idx.numel()).block),)
    _check(invariance_failures(run, SIZES))
