"""SGLang's own Triton decode attention on the GPU (bf16): a request's output row under SGLang's stock
split selection changes bits with the batch around it (the negative control); under its deterministic
mode's fixed tile and under the DETENT plugin's pinned tiles it does not. Needs SGLang's package on
the device (tests/sglang_env.py; `bench/sglang_wheels.sh` lists what to carry there)."""
from __future__ import annotations

import random

import pytest
import torch

from sglang_env import import_sglang

pytestmark = pytest.mark.gpu
sglang = import_sglang()

from sglang_decode_cases import Batch, backend, compositions  # noqa: E402

HEADS = [(32, 8, 128), (14, 2, 64)]  # Qwen3-8B-class, Qwen2-0.5B-class: query heads, KV heads, head dim


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS, ids=["32x8x128", "14x2x64"])
def test_a_requests_decode_row_keeps_its_bits_only_under_pinned_splits(heads, kv_heads, dim):
    rng = random.Random(0)
    lens = [rng.randint(64, 12000) for _ in range(256)]
    target = 5
    lens[target] = 3000
    batch = Batch(lens, num_head=heads, num_kv_head=kv_heads, dim=dim, dtype=torch.bfloat16, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ref = None
    patterns, counts = {}, {}
    for arm, tile in (("stock", 0), ("deterministic", 256), ("detent", 256), ("detent", 1024)):
        be, select = backend(arm, num_head=heads, num_kv_head=kv_heads, context=16384, sms=sms, tile=tile)
        outs, splits = [], set()
        for rows in compositions(len(lens), target):
            o, s = batch.row(target, rows, be, select)
            outs.append(o)
            splits.add(s)
            if ref is None:  # the row itself, against PyTorch: the kernel is attention
                k = batch.k[batch.tokens[target]].float().repeat_interleave(heads // kv_heads, 1)
                v = batch.v[batch.tokens[target]].float().repeat_interleave(heads // kv_heads, 1)
                p = torch.softmax(torch.einsum("hd,thd->ht", batch.q[target].float(), k) * dim ** -0.5, -1)
                ref = torch.einsum("ht,thd->hd", p, v)
                assert (o.float() - ref).abs().max() < 2e-2
        patterns[(arm, tile)] = len({o.view(torch.int16).cpu().numpy().tobytes() for o in outs})
        counts[(arm, tile)] = sorted(splits)
    assert patterns[("stock", 0)] > 1, f"control: SGLang's stock splits {counts[('stock', 0)]} should change bits"
    for key in (("deterministic", 256), ("detent", 256), ("detent", 1024)):
        assert patterns[key] == 1 and len(counts[key]) == 1, (key, patterns[key], counts[key])


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS, ids=["32x8x128", "14x2x64"])
def test_the_trainer_reproduces_an_sglang_rollout(heads, kv_heads, dim):
    """bf16 on the GPU: two sequences rolled out by SGLang's own kernels as the pinned backend runs them
    (chunked unified prefill, then one decode step per token among other requests), recomputed by the
    trainer's `rollout_attention` in one pass: every row equal. Control: the one-shot prefill (the
    extend kernel over whole sequences) misses the completion rows' bits."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified
    from sglang_decode_cases import sglang_rollout_rows
    from detent_rl.rollout.sglang_attention import rollout_attention
    g = torch.Generator(device="cpu").manual_seed(0)
    cu, prompts, tile, context = [0, 1400, 2300], [300, 150], 256, 4096
    q, k, v = (torch.randn(cu[-1], h, dim, generator=g).to(torch.bfloat16).cuda() for h in (heads, kv_heads, kv_heads))
    rolled = sglang_rollout_rows(q, k, v, cu, prompts, tile=tile, context=context)
    trained = rollout_attention(q, k, v, cu, prompts, tile=tile, context=context, scale=dim ** -0.5)
    assert not torch.isnan(rolled).any() and torch.equal(trained, rolled)
    i32 = dict(dtype=torch.int32, device="cuda")
    one_shot = torch.empty_like(q)
    extend_attention_fwd_unified(q, one_shot, k, v, 1.0, 1.0, torch.tensor(cu, **i32), torch.tensor(cu, **i32),
                                 torch.arange(cu[-1], **i32), torch.zeros(2, **i32), 1400, sm_scale=dim ** -0.5,
                                 is_causal=True)
    completion = torch.cat([torch.arange(a + p, b) for a, b, p in zip(cu, cu[1:], prompts)]).cuda()
    assert not torch.equal(one_shot[completion], rolled[completion]), "control: a one-shot prefill must differ"


MOE_SHAPES = [(128, 8, 2048, 768), (64, 6, 2048, 1408), (8, 2, 4096, 14336)]  # experts, top k, hidden, intermediate


def moe_rows_under_rows(experts: int, top_k: int, hidden: int, inter: int, tokens: int, device: str, ms=None):
    """SGLang's fused-MoE up projection of `tokens` random tokens under the config row SGLang picks at each
    M of `ms`: (the rows under the row of M = 1, every (row's M, tokens computed, equal to those) triple,
    the rows' distinct configs, the rows under M = 1's row with K visited in another order)."""
    from sglang_kernel_cases import moe_config, moe_up
    g = torch.Generator(device="cpu").manual_seed(0)
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden ** -0.5).to(torch.bfloat16).to(device)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(device)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32).to(device)
    weights = torch.rand(tokens, top_k, generator=g).to(device)
    shapes = ((experts, 2 * inter, hidden), (experts, hidden, inter))

    def rows(config, m, xs=x, ws=w1):
        run, out = moe_up(xs[:m], ws, ids[:m], weights[:m], config)
        run()
        return out

    configs = {m: moe_config("stock", *shapes, top_k, m) for m in (ms or (1, 8, 64, 512, 2048, 8192))}
    ref = rows(configs[1], tokens)
    checks = [(m_row, m, torch.equal(rows(config, m), ref[:m]))
              for m_row, config in configs.items() for m in sorted({1, min(77, tokens), tokens})]
    perm = torch.randperm(hidden, generator=g).to(device)
    moved = rows(configs[1], tokens, x[:, perm].contiguous(), w1[:, :, perm].contiguous())
    distinct = {tuple(sorted(c.items())) for c in configs.values()}
    return ref, checks, distinct, moved


@pytest.mark.parametrize("experts,top_k,hidden,inter", MOE_SHAPES, ids=["qwen3-30b-a3b", "64x6", "mixtral-8x7b"])
def test_fused_moe_config_rows_leave_a_tokens_bits_alone(experts, top_k, hidden, inter):
    """SGLang's fused-MoE kernel has no split K: its config rows vary tiles, warps and stages. The H200
    bench (docs/BENCHMARKS.md, session 16) found token 0's rows equal alone and in a batch under every
    arm, stock's M-keyed row included. Here every token's rows, among 1, 77 and 4,096 tokens under each
    row SGLang's table gives for M 1-8,192, equal those under the row of M = 1. Where this holds for the
    shapes a model uses, the MoE row is a schedule, not a value to pin (the plugin pins it today).
    Control: the same products with K visited in another order (one permutation of the hidden dimension
    applied to x and w1) round differently, so the comparison does see a reassociation."""
    ref, checks, distinct, moved = moe_rows_under_rows(experts, top_k, hidden, inter, 4096, "cuda")
    assert len(distinct) > 1, "SGLang's table should give these M more than one row"
    assert not torch.equal(moved, ref), "control: another K order must round some row differently"
    assert all(ok for *_, ok in checks), [c for c in checks if not c[2]]
