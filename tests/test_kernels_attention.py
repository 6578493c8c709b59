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
