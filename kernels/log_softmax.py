"""Log-softmax over the vocabulary and sampled-token logprobs, batch-invariant given (block, num_warps).

    x   = logits.float() / temperature        (the division only when temperature != 1.0)
    M, lse = the row's max and log-sum-exp, over fixed ranges of the vocabulary (`kernels/vocab.py`:
             per range a max and a `block`-lane fp32 sum of exp(x - m_r), folded in one combine)
    out = (x - M) - lse

`token_logprobs` runs the same reduction and the same final ops on one element per row, so its
value equals `log_softmax(...)[i, token_ids[i]]` bit for bit: the rollout may keep only the
sampled token's logprob while the trainer takes whole rows, and both see the same bits.
"""
import torch

from detent_rl.kernels._triton import FLOAT_DTYPES, INDEX_DTYPES, aligned, check_block, dense_rows, require_triton, \
    use_triton
from detent_rl.kernels.vocab import max_logsumexp_torch, vocab_pass, write_log_softmax


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


def _log_softmax_triton(logits: torch.Tensor, block: int, num_warps: int, temperature: float) -> torch.Tensor:
    require_triton(logits)
    logits = dense_rows(logits)
    if logits.shape[0] == 0:
        return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    stats = vocab_pass(logits, block=block, num_warps=num_warps, temperature=temperature, stats=True)
    return write_log_softmax(logits, stats["m"], stats["lse"], block=block, num_warps=num_warps,
                             temperature=temperature)


def log_softmax(logits: torch.Tensor, *, block: int, num_warps: int = 4,
                temperature: float = 1.0) -> torch.Tensor:
    """fp32 log-softmax of each row of logits [rows, vocab] (fp32, bf16 or fp16)."""
    _check(logits, block, temperature)
    if use_triton(logits):
        return _log_softmax_triton(logits, block, num_warps, temperature)
    x = _scaled_torch(logits, temperature)
    m, lse = max_logsumexp_torch(x, block)
    return (x - m[:, None]) - lse[:, None]


def _token_logprobs_triton(logits: torch.Tensor, token_ids: torch.Tensor, block: int, num_warps: int,
                           temperature: float) -> torch.Tensor:
    # An out-of-range id would read outside its row; ids come from sampling over this vocabulary.
    require_triton(logits)
    logits, token_ids = dense_rows(logits), aligned(token_ids)
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    return vocab_pass(logits, block=block, num_warps=num_warps, temperature=temperature,
                      token_ids=token_ids)["logprobs"]


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
    m, lse = max_logsumexp_torch(x, block)
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
