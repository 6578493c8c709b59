"""Attention on the CPU: reference, and prefill == prefill+decode == chunked == mixed batch ==
prefix hit, bit for bit, under the pinned selection; the stock selection visibly differs."""
from __future__ import annotations

import pytest
import torch

from attention_cases import FACTS, Requests, mismatches, scenario_outputs, selections
from detent_rl.kernels.attention import attention_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_matches_reference(dtype):
    _, detent = selections()
    reqs = Requests([300, 37, 5], FACTS, dtype, "cpu")
    outs = reqs.step([(0, 0, 300), (1, 0, 37), (2, 0, 5)], detent)
    for r, out in enumerate(outs):
        ref = attention_ref(reqs.q[r], reqs.k[r], reqs.v[r], 0, reqs.scale)
        err = (out.float() - ref.float()).abs().max().item()
        assert err < (1e-5 if dtype == torch.float32 else 3e-2), (r, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pinned_attention_is_invariant_and_stock_is_not(dtype):
    stock, detent = selections()
    reqs = Requests([290, 60, 7, 130], FACTS, dtype, "cpu", seed=1)
    assert mismatches(scenario_outputs(reqs, 0, detent, seed=2)) == []
    failures = mismatches(scenario_outputs(reqs, 0, stock, seed=2))
    assert failures, "negative control: stock tiles/splits follow the batch and must change bits"


def test_packed_tiles_interpreted():
    """The Triton kernel's packed rows (a tile = queries x the heads of one GQA group) address the
    same queries, heads and outputs as the unpacked ones: under the CPU interpreter both equal the
    reference, on prefill, chunked and decode steps (logic only; the GPU test compares bits)."""
    from interpreted import run_interpreted
    proc = run_interpreted("""
import torch
from attention_cases import FACTS, Requests, selections
from detent_rl.kernels.attention import attention_ref
facts = {**FACTS, "num_heads": 6, "num_kv_heads": 2, "head_dim": 16}
_, detent = selections(facts)
small = lambda *a: detent(*a)._replace(block_m=16, block_n=16, split_size=32, num_splits=16, num_stages=1)
reqs = Requests([36, 3, 1], facts, torch.float32, "cpu", seed=2)
for pack in (1, 3):
    reqs.pack = pack
    outs = reqs.step([(0, 0, 36), (1, 0, 3), (2, 0, 1)], small)
    outs += [torch.cat([reqs.step([(0, 0, 17)], small)[0], reqs.step([(0, 17, 19)], small)[0]])]
    outs += [torch.cat([reqs.step([(1, 0, 2)], small)[0], reqs.step([(1, 2, 1)], small)[0]])]
    for out, r in zip(outs, (0, 1, 2, 0, 1)):
        ref = attention_ref(reqs.q[r], reqs.k[r], reqs.v[r], 0, reqs.scale)
        err = (out - ref).abs().max().item()
        assert err < 1e-5, (pack, r, err)
print("packed ok")
""")
    assert proc.returncode == 0 and "packed ok" in proc.stdout, proc.stderr[-3000:]
