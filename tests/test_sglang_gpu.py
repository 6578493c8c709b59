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
