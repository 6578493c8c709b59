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
        patterns[(arm, tile)] = len({o.cpu().numpy().tobytes() for o in outs})
        counts[(arm, tile)] = sorted(splits)
    assert patterns[("stock", 0)] > 1, f"control: SGLang's stock splits {counts[('stock', 0)]} should change bits"
    for key in (("deterministic", 256), ("detent", 256), ("detent", 1024)):
        assert patterns[key] == 1 and len(counts[key]) == 1, (key, patterns[key], counts[key])
