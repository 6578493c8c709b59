"""Log-softmax over the vocabulary and sampled-token logprobs, batch-invariant given (block, num_warps).

    x   = logits.float() / temperature        (the division only when temperature != 1.0)
    m   = max(x)                              (exact: any association gives the same value)
    s   = sum(exp(x - m))                     (fp32 accumulator vector of `block` lanes, chunked)
    out = (x - m) - log(s)

`token_logprobs` runs the same reduction and the same final ops on one element per row, so its
value equals `log_softmax(...)[i, token_ids[i]]` bit for bit: the rollout may keep only the
sampled token's logprob while the trainer takes whole rows, and both see the same bits.
"""
import torch

from detent_rl.kernels._triton import (FLOAT_DTYPES, INDEX_DTYPES, aligned, check_block, dense_rows,
                                       fold_rows, require_triton, tl, triton, use_triton)


@triton.jit
def _row_max_logsumexp(row_ptr, n_cols, temperature, APPLY_TEMP: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    acc_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        if APPLY_TEMP:
            x = tl.math.div_rn(x, temperature)
        acc_max = tl.maximum(acc_max, x)
    m = tl.max(acc_max, axis=0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        if APPLY_TEMP:
            x = tl.math.div_rn(x, temperature)
        acc += tl.exp(x - m)  # masked lanes: exp(-inf) adds an exact zero
    return m, tl.log(tl.sum(acc, axis=0))


@triton.jit
def _log_softmax_kernel(x_ptr, out_ptr, n_cols, temperature, APPLY_TEMP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * n_cols
    m, lse = _row_max_logsumexp(row_ptr, n_cols, temperature, APPLY_TEMP, BLOCK)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if APPLY_TEMP:
            x = tl.math.div_rn(x, temperature)
        tl.store(out_ptr + row * n_cols + cols, (x - m) - lse, mask=mask)


@triton.jit
def _token_logprobs_kernel(x_ptr, ids_ptr, out_ptr, n_cols, temperature,
                           APPLY_TEMP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * n_cols
    m, lse = _row_max_logsumexp(row_ptr, n_cols, temperature, APPLY_TEMP, BLOCK)
    token = tl.load(ids_ptr + row).to(tl.int64)
    x = tl.load(row_ptr + token).to(tl.float32)
    if APPLY_TEMP:
        x = tl.math.div_rn(x, temperature)
    tl.store(out_ptr + row, (x - m) - lse)


def _check(logits: torch.Tensor, block: int, temperature: float) -> None:
    assert logits.dim() == 2 and logits.stride(-1) == 1, "logits must be [rows, vocab], last dim contiguous"
    assert logits.dtype in FLOAT_DTYPES, f"unsupported dtype {logits.dtype}"
    assert temperature > 0.0, f"temperature must be > 0, got {temperature}"
    check_block(block)


def _scaled_torch(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float()
    if temperature != 1.0:
        x = x / torch.tensor(temperature, dtype=torch.float32)  # IEEE division by the fp32 value
    return x


def _max_logsumexp_torch(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    m = fold_rows(x, block, float("-inf"), lambda part: part, torch.maximum, float("-inf"))
    s = fold_rows(x, block, float("-inf"), lambda part: torch.exp(part - m[:, None]), torch.add, 0.0)
    return m, torch.log(s)


def _launch(kernel: object, logits: torch.Tensor, out: torch.Tensor, extra: tuple,
            block: int, num_warps: int, temperature: float) -> None:
    if logits.shape[0] > 0:
        kernel[(logits.shape[0],)](logits, *extra, out, logits.shape[1], float(temperature),
                                   APPLY_TEMP=temperature != 1.0, BLOCK=block, num_warps=num_warps)


def _log_softmax_triton(logits: torch.Tensor, block: int, num_warps: int, temperature: float) -> torch.Tensor:
    require_triton(logits)
    logits = dense_rows(logits)
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    _launch(_log_softmax_kernel, logits, out, (), block, num_warps, temperature)
    return out


def log_softmax(logits: torch.Tensor, *, block: int, num_warps: int = 4,
                temperature: float = 1.0) -> torch.Tensor:
    """fp32 log-softmax of each row of logits [rows, vocab] (fp32, bf16 or fp16)."""
    _check(logits, block, temperature)
    if use_triton(logits):
        return _log_softmax_triton(logits, block, num_warps, temperature)
    x = _scaled_torch(logits, temperature)
    m, lse = _max_logsumexp_torch(x, block)
    return (x - m[:, None]) - lse[:, None]


def _token_logprobs_triton(logits: torch.Tensor, token_ids: torch.Tensor, block: int, num_warps: int,
                           temperature: float) -> torch.Tensor:
    # An out-of-range id would read outside its row; ids come from sampling over this vocabulary.
    require_triton(logits)
    logits, token_ids = dense_rows(logits), aligned(token_ids)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    _launch(_token_logprobs_kernel, logits, out, (token_ids,), block, num_warps, temperature)
    return out


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, *, block: int, num_warps: int = 4,
                   temperature: float = 1.0) -> torch.Tensor:
    """fp32 [rows]: log_softmax(logits)[i, token_ids[i]], with the same bits as `log_softmax`."""
    _check(logits, block, temperature)
    assert token_ids.shape == (logits.shape[0],) and token_ids.dtype in INDEX_DTYPES, \
        f"token_ids must be [{logits.shape[0]}] int32/int64, got {tuple(token_ids.shape)} {token_ids.dtype}"
    assert token_ids.device == logits.device, "token_ids must be on the logits' device"
    if use_triton(logits):
        return _token_logprobs_triton(logits, token_ids, block, num_warps, temperature)
    x = _scaled_torch(logits, temperature)
    m, lse = _max_logsumexp_torch(x, block)
    picked = x.gather(1, token_ids.long()[:, None])[:, 0]
    return (picked - m) - lse


def log_softmax_ref(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return torch.log_softmax(x, dim=-1)


def token_logprobs_ref(logits: torch.Tensor, token_ids: torch.Tensor, *,
                       temperature: float = 1.0) -> torch.Tensor:
    return log_softmax_ref(logits, temperature=temperature).gather(1, token_ids.long()[:, None])[:, 0]
