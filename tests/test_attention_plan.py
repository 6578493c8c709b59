"""kernels/attention_plan.py's call-shape key, on the CPU: what makes two eager attention calls one recorded shape
(the GPU file replays them and compares the bits)."""
from __future__ import annotations

import torch

from detent_rl.kernels import attention_plan
from detent_rl.kernels.attention import AttnMeta, attn_meta
from detent_rl.kernels.attention_plan import plan_for

H, KVH, D, PAGE = 14, 2, 64, 16
PARAMS = (0.125, 64, 256, 2, 4, 2, False, False, False, False)  # scale, block_n, split, splits, ..., direct


def _call(seed: int, q_lens=(1, 1, 100), cached=(300, 300, 0)):
    torch.manual_seed(seed)
    widths = [-(-(c + n) // PAGE) for n, c in zip(q_lens, cached)]
    table = torch.arange(len(q_lens) * max(widths), dtype=torch.int32).view(len(q_lens), max(widths))
    meta = attn_meta(list(q_lens), list(cached), table, 64)
    T, pages = sum(q_lens), int(table.max()) + 1
    q = torch.randn(T, H, D)
    k, v = torch.randn(pages, PAGE, KVH, D), torch.randn(pages, PAGE, KVH, D)
    return q, k, v, meta, torch.empty_like(q)


def test_layers_of_a_step_share_a_plan_and_other_shapes_do_not():
    attention_plan._PLANS.clear()
    a = plan_for(*_call(0), PARAMS)
    assert a is not None and not a.ready
    assert plan_for(*_call(1), PARAMS) is a, "another layer's tensors, the same shapes: the same plan"
    assert plan_for(*_call(2, q_lens=(1, 1, 101)), PARAMS) is not a, "one more row: another grid"
    assert plan_for(*_call(0), PARAMS[:3] + (3,) + PARAMS[4:]) is not a, "another split count"
    assert plan_for(*_call(0), PARAMS[:-1] + (True,)) is not a, "the kernel's own epilogue"
    assert len(attention_plan._PLANS) == 4


def test_one_tensor_in_two_roles_is_its_own_shape():
    """A decode graph's metadata passes one tensor as pos0 and token_pos: its record keeps one role for both."""
    attention_plan._PLANS.clear()
    q, k, v, meta, out = _call(0, q_lens=(1, 1, 1), cached=(300, 300, 5))
    aliased = AttnMeta(meta.cu_q, meta.token_pos, meta.token_pos, meta.block_table, meta.tile_req, meta.tile_q0, 64)
    assert plan_for(q, k, v, aliased, out, PARAMS) is not plan_for(q, k, v, meta, out, PARAMS)


def test_an_unaligned_pointer_takes_the_plain_path():
    attention_plan._PLANS.clear()
    q, k, v, meta, out = _call(0)
    shifted = torch.empty(q.numel() + 1)[1:].view(q.shape)  # 4 bytes past an aligned address
    assert plan_for(q, k, v, meta, shifted, PARAMS) is None
    assert plan_for(q, k, v, meta, out, PARAMS) is not None


def test_attn_meta_packs_one_host_tensor_with_aligned_arrays():
    """`attn_meta` carries the step's lists (and a host page table bound for `device`) in one tensor: each array
    keeps its values and starts at a 16-byte multiple, which Triton's pointer specialisation reads."""
    q_lens, cached = [1, 3, 5], [7, 0, 2]
    table = torch.tensor([[4, 0], [5, 6], [7, 8]], dtype=torch.int64)
    meta = attn_meta(q_lens, cached, table, 4, device="cpu")  # the table on the device already: not carried
    assert meta.block_table.dtype == torch.int32 and meta.block_table.tolist() == table.tolist()
    assert meta.cu_q.tolist() == [0, 1, 4, 9] and meta.pos0.tolist() == cached
    assert meta.token_pos.tolist() == [7, 0, 1, 2, 2, 3, 4, 5, 6]
    assert meta.tile_req.tolist() == [0, 1, 2, 2] and meta.tile_q0.tolist() == [0, 1, 4, 8]
    views = (meta.cu_q, meta.pos0, meta.token_pos, meta.tile_req, meta.tile_q0)
    assert len({t.untyped_storage().data_ptr() for t in views}) == 1, "one host tensor, one copy"
    assert all(t.data_ptr() % 16 == 0 for t in views)
    assert meta.scratch == {} and meta.cu_q_host == (0, 1, 4, 9)
