"""The eager attention's recorded launches (kernels/attention_plan.py) on the GPU: a step's later layers replay the
first layer's launches with their own tensors swapped in, and write the bits Triton's own launch path writes.

Control: every layer has its own q and caches, so a replay that kept the recording layer's tensors would write
that layer's output (checked to differ from the next layer's)."""
from __future__ import annotations

import os

import pytest
import torch

from detent_rl.host_phases import host_phases
from detent_rl.kernels import attention_plan
from detent_rl.kernels.attention import AttnMeta, attn_meta, paged_attention

pytestmark = pytest.mark.gpu

H, KVH, D, PAGE = 14, 2, 64, 16
REPLAYS = "detent_rl.kernels.launch:Recorded.__call__"


def _layers(n: int, pages: int, tokens: int, seed: int) -> list[tuple]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    return [(torch.randn(tokens, H, D, **bf), torch.randn(pages, PAGE, KVH, D, **bf),
             torch.randn(pages, PAGE, KVH, D, **bf)) for _ in range(n)]


def _table(q_lens: list[int], cached: list[int]) -> tuple[torch.Tensor, int]:
    widths = [-(-(c + n) // PAGE) for n, c in zip(q_lens, cached)]
    rows, at = [], 0
    for w in widths:
        rows.append(list(range(at, at + w)) + [0] * (max(widths) - w))
        at += w
    return torch.tensor(rows, dtype=torch.int32, device="cuda"), at


def _attend(layers, meta, params, triton_path: bool) -> list[torch.Tensor]:
    outs = []
    held = os.environ.get("DETENT_LAUNCH")
    os.environ["DETENT_LAUNCH"] = "triton" if triton_path else ""
    try:
        for q, k, v in layers:
            outs.append(paged_attention(q, k, v, meta, scale=D ** -0.5, **params))
    finally:
        os.environ.pop("DETENT_LAUNCH") if held is None else os.environ.__setitem__("DETENT_LAUNCH", held)
    torch.cuda.synchronize()
    return outs


# (query lengths, cached lengths, block_m, pack, num_splits, split_size): one split in 16-row tiles writes the
# output itself; more splits go through the combine, by row (< 256 rows) or by the row's heads (>= 256)
CASES = {"mixed, combine by (row, head)": ([1] * 7 + [100], [300] * 7 + [0], 64, 1, 2, 256),
         "prefill, combine by row": ([300, 200], [0, 40], 64, 1, 1, 256),
         "decode, one split, packed": ([1] * 9, [200] * 9, 16, 7, 1, 256),
         "decode, four splits, packed": ([1] * 9, [500] * 9, 16, 7, 4, 128)}


@pytest.mark.parametrize("case", list(CASES))
def test_replayed_layers_write_tritons_bits(case):
    q_lens, cached, block_m, pack, splits, split_size = CASES[case]
    table, pages = _table(q_lens, cached)
    meta = attn_meta(q_lens, cached, table, block_m, pack)
    layers = _layers(4, pages, sum(q_lens), seed=len(case))
    params = dict(block_n=64, split_size=split_size, num_splits=splits, combine=None if splits == 1 else True)
    if splits == 1 and block_m == 64:
        params["combine"] = True
    attention_plan._PLANS.clear()
    with host_phases([REPLAYS]) as replays:
        ours = _attend(layers, meta, params, triton_path=False)
    launches = 1 if splits == 1 and block_m <= 16 else 2
    assert replays.calls[REPLAYS] == 3 * launches, "layers 2-4 replay the first layer's launches"
    ref = _attend(layers, meta, params, triton_path=True)
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert torch.equal(a, b), f"{case}: layer {i} differs from Triton's own launch"
    assert not torch.equal(ours[1], ours[0]), "control: the layers' outputs differ (their own tensors)"


def test_aliased_metadata_is_its_own_plan():
    """A decode graph's metadata passes one tensor as pos0 and token_pos: a record of it keeps one role for both,
    so a step of the same shapes with two tensors is another call shape (recorded anew, then replayed)."""
    q_lens, cached = [1] * 9, [200] * 9
    table, pages = _table(q_lens, cached)
    built = attn_meta(q_lens, cached, table, 16, 7)
    pos = built.token_pos
    aliased = AttnMeta(built.cu_q, pos, pos, built.block_table, built.tile_req, built.tile_q0, 16, 7)
    layers = _layers(2, pages, 9, seed=11)
    params = dict(block_n=64, split_size=128, num_splits=2)
    attention_plan._PLANS.clear()
    _attend(layers, aliased, params, triton_path=False)
    # the same rows a step later: pos0 [200]*9 and token_pos [200]*9 as separate tensors
    separate = attn_meta(q_lens, cached, table, 16, 7)
    with host_phases([REPLAYS]) as replays:
        ours = _attend(layers, separate, params, triton_path=False)
    assert replays.calls[REPLAYS] == 2, "only the second layer replays: the aliased record is another plan"
    assert len(attention_plan._PLANS) == 2
    ref = _attend(layers, separate, params, triton_path=True)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))
