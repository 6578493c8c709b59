"""The paged KV cache's store: a step's keys and values written at flat slots (page * page_size + offset) of
dense caches [pages, page_size, KVH, D], as `attention.paged_attention` reads them (and `rotary`'s fused store
writes them)."""
from __future__ import annotations

import torch

from detent_rl.kernels._triton import INDEX_DTYPES


def check_store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slots: torch.Tensor) -> None:
    """The step's keys/values [T, KVH, D] fit dense caches [pages, page_size, KVH, D] at slots [T]."""
    assert k.dim() == 3 and k.shape == v.shape and k_cache.shape == v_cache.shape and \
        k.shape[1:] == k_cache.shape[2:], \
        f"k, v [T, KVH, D] and caches [pages, page_size, KVH, D] expected, got {tuple(k.shape)}, " \
        f"{tuple(v.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "k and v need a contiguous last dim"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "a flat slot indexes dense caches"
    assert k.dtype == v.dtype == k_cache.dtype == v_cache.dtype, "k, v and the caches share the model dtype"
    assert slots.shape == (k.shape[0],) and slots.dtype in INDEX_DTYPES, \
        f"slots must be [{k.shape[0]}] int32/int64, got {tuple(slots.shape)} {slots.dtype}"
    assert len({t.device for t in (k, v, k_cache, v_cache, slots)}) == 1, "all tensors on one device"


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Write the step's keys/values [T, KVH, D] into the pages at flat slots (page * size + offset)."""
    check_store(k, v, k_cache, v_cache, slots)
    k_cache.view(-1, *k_cache.shape[2:])[slots.long()] = k
    v_cache.view(-1, *v_cache.shape[2:])[slots.long()] = v
