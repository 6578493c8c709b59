"""Token embedding: weight[ids], a gather; exact, so every row is batch-invariant by construction."""
import torch
import torch.nn.functional as F

from detent_rl.kernels._triton import INDEX_DTYPES, check_block, pdl, pdl_enter, require_triton, tl, triton, use_triton
from detent_rl.kernels.launch import launch


@triton.jit
def _embedding_kernel(ids_ptr, w_ptr, out_ptr, hidden, w_stride, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    idx = tl.load(ids_ptr + tok).to(tl.int64)
    tl.store(out_ptr + tok * hidden + cols, tl.load(w_ptr + idx * w_stride + cols, mask=mask), mask=mask)


def _embedding_triton(ids: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
    # Ids are not range-checked on the GPU (that would synchronize); they come from the tokenizer
    # or the sampler over this vocabulary.
    require_triton(weight)
    flat = ids.reshape(-1).contiguous()
    hidden = weight.shape[1]
    out = torch.empty((flat.numel(), hidden), dtype=weight.dtype, device=weight.device)
    if flat.numel() > 0:
        launch(_embedding_kernel, (flat.numel(), triton.cdiv(hidden, block)),
            flat, weight, out, hidden, weight.stride(0), BLOCK=block, **pdl(weight))
    return out.view(*ids.shape, hidden)


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, block: int) -> torch.Tensor:
    """weight[ids]: ids of any shape (int32/int64), weight [vocab, hidden] -> ids.shape + (hidden,)."""
    assert ids.dtype in INDEX_DTYPES, f"ids must be int32/int64, got {ids.dtype}"
    assert weight.dim() == 2 and weight.stride(1) == 1, "weight must be [vocab, hidden], last dim contiguous"
    assert ids.device == weight.device, "ids and weight must be on the same device"
    check_block(block)
    if use_triton(weight):
        return _embedding_triton(ids, weight, block)
    return weight[ids]


def embedding_ref(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids.long(), weight)
