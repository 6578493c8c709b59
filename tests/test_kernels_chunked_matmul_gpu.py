"""The chunked linear on the H200: on every linear site of the 0.5B config, a row's bits are the same
for M in {1, 3, 16, 100, M_full} under six schedules (parallel chunks and sequential chunks, tiles
from 16x64 to 128x256, BLOCK_K 32/64/128, 4 or 8 warps, 3 or 4 stages); another chunk size changes
them (the negative control)."""
from __future__ import annotations

import pytest
import torch

from detent_rl.kernels.chunked_matmul import chunked_linear

pytestmark = pytest.mark.gpu

CHUNK = 128
# (n, k, bias): qkv, o, gate_up, down, LM head of Qwen2-0.5B
SITES = [(1152, 896, True), (896, 896, False), (9728, 896, False), (896, 4864, False), (151936, 896, False)]
SCHEDULES = [  # parallel, block_m, block_n, block_k, num_warps, num_stages
    (True, 16, 64, 32, 4, 3), (True, 64, 128, 64, 4, 3), (True, 16, 128, 128, 4, 4),
    (False, 128, 128, 32, 8, 3), (False, 64, 64, 64, 4, 4), (False, 128, 256, 64, 8, 3),
]


def _data(n, k, bias, rows):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if bias else None
    return torch.randn(rows, k, generator=g, device="cuda").to(torch.bfloat16), w, b


def _run(x, w, b, schedule, chunk=CHUNK):
    parallel, bm, bn, bk, warps, stages = schedule
    return chunked_linear(x, w, b, chunk=chunk, parallel=parallel, block_m=bm, block_n=bn, block_k=bk,
                          num_warps=warps, num_stages=stages)


@pytest.mark.parametrize("n, k, bias", SITES, ids=[f"{n}x{k}" for n, k, _ in SITES])
def test_rows_follow_the_chunk_not_m_or_the_schedule(n, k, bias):
    rows = 256 if n > 100_000 else 2048
    x, w, b = _data(n, k, bias, rows)
    full = _run(x, w, b, (False, 128, 128, 64, 8, 3))
    ref = (x.float() @ w.float().t() + (b.float() if b is not None else 0)).to(torch.bfloat16)
    assert (full.float() - ref.float()).abs().max().item() < 0.05
    bad = []
    for schedule in SCHEDULES:
        for m in (1, 3, 16, 100, rows):
            got = _run(x[:m], w, b, schedule)
            rows_bad = (got != full[:m]).any(dim=1).nonzero().flatten().tolist()
            if rows_bad:
                bad.append(f"{schedule} M={m}: rows {rows_bad[:4]}")
    assert not bad, "rows changed with M or the schedule:\n" + "\n".join(bad)


def test_another_chunk_rounds_differently():
    changed = []
    for n, k, bias in SITES[:4]:
        x, w, b = _data(n, k, bias, 64)
        a = _run(x, w, b, SCHEDULES[0], chunk=CHUNK)
        c = _run(x, w, b, SCHEDULES[0], chunk=64)
        changed.append(not torch.equal(a, c))
    assert any(changed), "a different K partition must change some site's bits, else the pin is vacuous"
