"""The trainer's forward with autograd gives the rollout's bits, and its gradients are transformers'.

`completion_logprobs` with the weights requiring grad runs every kernel through kernels.autograd:
the forward bits must equal the no-grad forward (so the first minibatch's ratio is exactly 1),
and the gradient of a loss on them must match transformers' autograd on the same checkpoint.
"""
from __future__ import annotations

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.models.context import set_context
from detent_rl.models.runner import Span, completion_logprobs, step_inputs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from test_models import LIMITS, hf_model, save, sequences

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _batch(seed: int) -> tuple[list[tuple[list[int], int]], list[float]]:
    seqs = sequences(seed, (9, 23, 40))
    return [(s, p) for s, p in zip(seqs, (4, 17, 1))], [1.0, 0.7, 1.0]


def _hf_grads(hf, batch, temps) -> dict[str, torch.Tensor]:
    hf.zero_grad()
    loss = 0.0
    for (tokens, n_prompt), t in zip(batch, temps):
        ids = torch.tensor([tokens])
        logits = hf(ids).logits[0, n_prompt - 1:len(tokens) - 1].float() / t
        lp = torch.log_softmax(logits, -1).gather(1, ids[0, n_prompt:, None])[:, 0]
        loss = loss + lp.sum()
    loss.backward()
    return {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}


def _ours_as_hf(name: str, grad: torch.Tensor, model) -> dict[str, torch.Tensor]:
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        module = model.get_submodule(".".join(parts[:-1]))
        sizes = [module.offsets[s][1] for s in module.offsets]
        return {".".join(parts[:-2] + [hf, parts[-1]]): g
                for hf, g in zip(FUSED[parts[-2]], grad.split(sizes))}
    return {name: grad}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_forward_with_grad_has_the_no_grad_bits_and_transformers_gradients(tmp_path, family):
    hf = hf_model(family)
    model = load_model(save(hf, tmp_path), "detent", dtype=torch.float32, **LIMITS)
    batch, temps = _batch(seed=3)
    with torch.no_grad():
        plain = completion_logprobs(model, batch, temps)
    for p in model.parameters():
        p.requires_grad_(True)
    with_grad = completion_logprobs(model, batch, temps)
    assert all(torch.equal(a, b.detach()) for a, b in zip(plain, with_grad)), "the ratio would not be 1.0"
    torch.stack([x.sum() for x in with_grad]).sum().backward()
    want = _hf_grads(hf.float(), batch, temps)
    got = {}
    for name, p in model.named_parameters():
        got.update(_ours_as_hf(name, p.grad, model))
    if "lm_head.weight" not in got and "lm_head.weight" in want:  # tied: one tensor's gradient
        got["lm_head.weight"] = got["model.embed_tokens.weight"]
    assert set(got) == set(want)
    for name, g in want.items():
        err = (got[name] - g).norm() / g.norm().clamp(min=1e-12)
        assert err < 2e-4, f"{name}: relative gradient error {err:.2e}"


def test_bf16_forward_with_grad_has_the_rollout_bits(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.bfloat16, **LIMITS)
    params = [SamplingParams(seed=s, temperature=1.0, max_tokens=6) for s in (1, 2, 3)]
    rolled = Engine(model, num_blocks=32).generate(sequences(5, (5, 18, 33)), params)
    for p in model.parameters():
        p.requires_grad_(True)
    trained = completion_logprobs(model, [(s.tokens, s.num_prompt) for s in rolled], [1.0] * 3)
    assert [t.tolist() for t in trained] == [s.logprobs for s in rolled]
    trained[0].sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_stock_arm_with_grad_does_not_reproduce_the_rollout(tmp_path):
    """Negative control of the check above (fp32, where the CPU stock arm visibly reads the batch)."""
    model = load_model(save(hf_model("qwen2"), tmp_path), "stock", dtype=torch.float32, **LIMITS)
    params = [SamplingParams(seed=s, temperature=1.0, max_tokens=6) for s in range(8)]
    # prompts past 64 tokens: decode then reads its keys in the stock selection's wider tiles
    rolled = Engine(model, num_blocks=64).generate(sequences(5, (5, 18, 33, 70, 12, 90, 9, 100)), params)
    for p in model.parameters():
        p.requires_grad_(True)
    trained = completion_logprobs(model, [(s.tokens, s.num_prompt) for s in rolled], [1.0] * 8)
    assert [t.tolist() for t in trained] != [s.logprobs for s in rolled]


def test_a_cached_prefix_is_refused_under_grad(tmp_path):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    for p in model.parameters():
        p.requires_grad_(True)
    caches = model.allocate_kv_cache(4)
    ids, pos, ctx = step_inputs(model, caches, [Span([1, 2, 3], 5, [0, 1])])
    with set_context(ctx), pytest.raises(ValueError, match="prefill every sequence from position 0"):
        model(ids, pos)
    with pytest.raises(ValueError, match="prompt length 3 must be >= 1 and leave a completion"):
        completion_logprobs(model, [([1, 2, 3], 3)], [1.0])


def _attention_per_sequence(q, k, v, cu, scale):
    """The plain formula, one sequence at a time (GQA by repeating k/v heads)."""
    rep = q.shape[1] // k.shape[1]
    outs = []
    for s, e in zip(cu, cu[1:]):
        qb, kb, vb = (x[s:e].float().repeat_interleave(r, 1).transpose(0, 1) for x, r in ((q, 1), (k, rep), (v, rep)))
        outs.append(torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
                    .transpose(0, 1).to(q.dtype))
    return torch.cat(outs)


@pytest.mark.parametrize("score_bytes", [1, 40_000, 1 << 30], ids=["one-each", "groups", "one-call"])
def test_the_padded_attention_reference_is_the_per_sequence_formula(score_bytes):
    """Padding sequences into one causal call (or a few, under a memory bound) changes neither the
    output nor the gradients: pad rows are never attended and their outputs are dropped."""
    from detent_rl.kernels.autograd import _attention_backward, _attention_ref
    g = torch.Generator().manual_seed(0)
    cu = [0, 5, 6, 30, 47, 50]
    q, k, v = (torch.randn(50, h, 16, generator=g, requires_grad=True) for h in (4, 2, 2))
    got, want = _attention_ref(q, k, v, cu, 0.25, score_bytes), _attention_per_sequence(q, k, v, cu, 0.25)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)
    up = torch.randn(got.shape, generator=g)
    expected = torch.autograd.grad(want, (q, k, v), up)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), up), expected):
        assert torch.allclose(a, b, atol=1e-5)
    # the trainer's backward: the same gradients, taken on the padded batches directly
    for a, b in zip(_attention_backward(q.detach(), k.detach(), v.detach(), up, cu, 0.25, score_bytes), expected):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    # the control: the pack attended as one sequence (no padding) lets rows read other sequences
    shuffled = _attention_per_sequence(q, k, v, [0, 50], 0.25)
    assert not torch.allclose(shuffled, want, atol=1e-3)


def _grads(out, inputs, up):
    outs = out if isinstance(out, tuple) else (out,)
    ups = up if isinstance(up, tuple) else (up,)
    return torch.autograd.grad(outs, inputs, ups, allow_unused=True)


def _close(got, want, tol):
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            err = (a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)
            assert err < tol, f"relative gradient error {err:.2e}"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_closed_form_backwards_are_the_references_gradients(dtype, tol):
    """Each op's hand-written backward (kernels.autograd) against autograd through its PyTorch
    reference: RMSNorm with and without the residual add (the gradient reaching h too), SiLU-and-mul,
    rotary on the whole head and on part of it, and the token log-softmax over segments of rows with
    their own temperatures."""
    from detent_rl.kernels import autograd as ag
    from detent_rl.kernels.log_softmax import token_logprobs_ref
    from detent_rl.kernels.rmsnorm import rmsnorm_ref
    from detent_rl.kernels.rotary import apply_rotary_ref
    from detent_rl.kernels.silu_and_mul import silu_and_mul_ref
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype).requires_grad_(True)  # noqa: E731

    x, r, w = rand(37, 64), rand(37, 64), rand(64)
    up, up_h = torch.randn(37, 64, generator=g).to(dtype), torch.randn(37, 64, generator=g).to(dtype)
    got = _grads(ag.rmsnorm_autograd(x, w, 1e-6, block=64, num_warps=4, residual=r), (x, w, r), (up, up_h))
    _close(got, _grads(rmsnorm_ref(x, w, 1e-6, residual=r), (x, w, r), (up, up_h)), tol)
    got = _grads(ag.rmsnorm_autograd(x, w, 1e-6, block=64, num_warps=4), (x, w), up)
    _close(got, _grads(rmsnorm_ref(x, w, 1e-6), (x, w), up), tol)

    xs, up = rand(21, 96), torch.randn(21, 48, generator=g).to(dtype)
    _close(_grads(ag.silu_and_mul_autograd(xs, block=64), (xs,), up), _grads(silu_and_mul_ref(xs), (xs,), up), tol)

    positions = torch.tensor([0, 1, 2, 7, 3, 40, 5, 6, 9])
    for rot in (16, 8):  # the whole head, the first half (partial rotary)
        angles = torch.arange(64)[:, None].float() * torch.rand(rot // 2, generator=g)
        cos, sin = (torch.cat([f(angles)] * 2, dim=1).to(dtype) for f in (torch.cos, torch.sin))
        q, k = rand(9, 4, 16), rand(9, 2, 16)
        ups = (torch.randn(9, 4, 16, generator=g).to(dtype), torch.randn(9, 2, 16, generator=g).to(dtype))
        cache = torch.zeros(4, 16, 2, 16, dtype=dtype)
        got = ag.rotary_store_autograd(q, k, k.detach(), positions, cos, sin, cache, cache.clone(),
                                       torch.arange(9), block=64)
        _close(_grads(got, (q, k), ups), _grads(apply_rotary_ref(q, k, positions, cos, sin), (q, k), ups), tol)

    logits, ids = rand(11, 50), torch.randint(0, 50, (11,), generator=g)
    segments = [(0, 4, 64, 4, 1.0), (4, 1, 64, 4, 0.7), (5, 6, 64, 4, 1.3)]
    up = torch.randn(11, generator=g)
    got = _grads(ag.token_logprobs_segments_autograd(logits, ids, segments), (logits,), up)
    want = torch.cat([token_logprobs_ref(logits[a:a + n], ids[a:a + n], temperature=t) for a, n, _, _, t in segments])
    _close(got, _grads(want, (logits,), up), tol)


def test_backward_kernels_interpreted():
    """The GPU's backward kernels (Triton's CPU interpreter) against their PyTorch forms. RMSNorm: several
    rows per program with a ragged last program, a row narrower than its block, with and without the
    gradient reaching h. SiLU-and-mul: a row of two blocks, the second ragged."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
import detent_rl.kernels.rmsnorm as R
g = torch.Generator().manual_seed(0)
R.BACKWARD_PROGRAMS = 4
h, gy, gh = (torch.randn(37, 48, generator=g) for _ in range(3))
w = torch.randn(48, generator=g)
for extra in (gh, None):
    got, want = R._rmsnorm_backward_triton(h, w, gy, extra, 1e-6), R._rmsnorm_backward_torch(h, w, gy, extra, 1e-6)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (a - b).abs().max()
import detent_rl.kernels.silu_and_mul as S
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2 ** -6)):  # bf16: an ulp or two (silu's fp32 ops)
    x, gy = torch.randn(5, 2 * 1500, generator=g).to(dtype), torch.randn(5, 1500, generator=g).to(dtype)
    got, want = S._silu_and_mul_backward_triton(x, gy), S._silu_and_mul_backward_torch(x, gy)
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=1e-5), (got.float() - want.float()).abs().max()
print("ok")
""")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_forward_with_grad_has_the_rollout_bits_and_close_gradients(tmp_path, dtype):
    hf = hf_model("qwen2")
    model = load_model(save(hf, tmp_path), "detent", device="cuda", dtype=dtype, **LIMITS)
    params = [SamplingParams(seed=s, temperature=1.0, max_tokens=6) for s in (1, 2, 3)]
    rolled = Engine(model, num_blocks=32).generate(sequences(5, (5, 18, 33)), params)
    for p in model.parameters():
        p.requires_grad_(True)
    batch = [(s.tokens, s.num_prompt) for s in rolled]
    trained = completion_logprobs(model, batch, [1.0] * 3)
    assert [t.tolist() for t in trained] == [s.logprobs for s in rolled]
    torch.stack([x.sum() for x in trained]).sum().backward()
    if dtype == torch.float32:
        want = _hf_grads(hf.float(), batch, [1.0] * 3)
        got = {}
        for name, p in model.named_parameters():
            got.update(_ours_as_hf(name, p.grad.cpu(), model))
        for name, g in want.items():
            if name in got:
                err = (got[name] - g).norm() / g.norm().clamp(min=1e-12)
                assert err < 1e-2, f"{name}: relative gradient error {err:.2e}"  # TF32-free, split orders differ


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_backward_kernels_match_their_pytorch_forms(dtype):
    """The RMSNorm and SiLU-and-mul backward kernels on the GPU, at the 0.5B/1.5B widths and a
    micro-batch's rows, against their PyTorch forms on the same device (an ulp or two in bf16)."""
    import detent_rl.kernels.rmsnorm as R
    import detent_rl.kernels.silu_and_mul as S
    g = torch.Generator(device="cuda").manual_seed(0)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -6
    for rows, hidden, inter in ((3712, 896, 4864), (517, 1536, 8960)):
        h, gy, gh = (torch.randn(rows, hidden, generator=g, device="cuda").to(dtype) for _ in range(3))
        w = torch.randn(hidden, generator=g, device="cuda").to(dtype)
        for extra in (gh, None):
            got, want = (R._rmsnorm_backward_triton(h, w, gy, extra, 1e-6),
                         R._rmsnorm_backward_torch(h, w, gy, extra, 1e-6))
            for a, b in zip(got, want):
                err = (a.float() - b.float()).norm() / b.float().norm()
                assert err < tol, f"rmsnorm backward {rows}x{hidden}: relative error {err:.2e}"
        x = torch.randn(rows, 2 * inter, generator=g, device="cuda").to(dtype)
        gy = torch.randn(rows, inter, generator=g, device="cuda").to(dtype)
        got, want = S._silu_and_mul_backward_triton(x, gy), S._silu_and_mul_backward_torch(x, gy)
        assert torch.allclose(got.float(), want.float(), rtol=tol, atol=1e-5)


@pytest.mark.gpu
def test_gpu_flash_backward_at_our_lse_is_the_padded_gradient_and_deterministic(tmp_path, monkeypatch):
    """bf16 on the GPU: the attention gradient by FlashAttention's varlen backward at our forward's own
    output and log-sum-exp equals, to bf16 rounding, the padded SDPA path's (which reruns flash's
    forward), and repeats bit for bit. Control: the same backward told that the micro-batch is one
    sequence (rows attending other sequences' keys) strays far past the bound."""
    from detent_rl.kernels import autograd as A
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", device="cuda", dtype=torch.bfloat16, **LIMITS)
    for p in model.parameters():
        p.requires_grad_(True)
    batch, temps = _batch(3)

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.stack([x.sum() for x in completion_logprobs(model, batch, temps)]).sum().backward()
        return {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}

    def worst(a: dict, b: dict) -> float:
        return max(((a[n] - b[n]).norm() / b[n].norm().clamp(min=1e-12)).item() for n in b)

    flash = grads()
    assert all(torch.equal(a, flash[n]) for n, a in grads().items()), "the flash backward must repeat its bits"
    real_applies, real_backward = A.flash_backward_applies, A._flash_backward
    monkeypatch.setattr(A, "flash_backward_applies", lambda q: False)
    padded = grads()
    assert worst(flash, padded) < 3e-2, worst(flash, padded)
    monkeypatch.setattr(A, "flash_backward_applies", real_applies)
    monkeypatch.setattr(A, "_flash_backward", lambda q, k, v, out, lse, g, cu, scale:
                        real_backward(q, k, v, out, lse, g, [0, cu[-1]], scale))
    assert worst(grads(), padded) > 0.1, "control: one merged sequence must change the gradients"
