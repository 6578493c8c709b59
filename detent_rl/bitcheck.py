"""Per-step bit-checks of rollout vs rescored logprobs, and the run's logs (jsonl, TensorBoard, progress).

`bitcheck` compares, token by token, the logprob the rollout engine recorded when it sampled a token
with the logprob the trainer's rescore computes for it. Equality is of BITS (each fp32 viewed as an
int32), so -0.0 and 0.0 differ and a NaN equals only a NaN with the same payload. `enforce` turns a
record with any differing token into a `MismatchError` (policy "raise") or a `MismatchWarning`
(policy "warn"), naming the first mismatch.
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import warnings
from typing import Literal, Sequence

import torch

POLICIES = ("raise", "warn")


class MismatchError(RuntimeError):
    """A bit-check found rollout and rescored logprobs that differ; `.record` is the bit-check record."""

    def __init__(self, message: str, record: dict) -> None:
        super().__init__(message)
        self.record = record


class MismatchWarning(UserWarning):
    """Category of the warning `enforce` emits under policy "warn"."""


def bitcheck(step: int, request_ids: Sequence[str], rollout: Sequence[torch.Tensor],
             rescored: Sequence[torch.Tensor], max_mismatches: int = 16) -> dict:
    """Compare each request's rollout logprobs with its rescored logprobs, bit for bit.

    Each request contributes two 1-D fp32 tensors of equal length (one logprob per sampled token).
    The record holds: step; sequences and sequences_equal (requests whose tokens are all
    bit-equal); tokens_compared, tokens_equal and bit_match = tokens_equal / tokens_compared (1.0
    when no token is compared); first_mismatches, up to `max_mismatches` of
    {step, request_id, position, rollout, rescored, rollout_bits, rescored_bits} in request order then
    position, with values as `float.hex` and bits as "0x%08x" (the hex of a NaN hides its payload);
    max_abs_diff = max |rollout - rescored|; kl_k1 and kl_k3; sha256_rollout and sha256_rescored over
    the requests' little-endian fp32 bytes concatenated in request order.

    KL direction: the tokens were sampled from the rollout policy p and q is the rescore policy, so
    with r = log q(x) - log p(x), k1 = mean(-r) and k3 = mean(exp(r) - 1 - r) both estimate
    KL(p || q) (Schulman's k1 and k3), the mean taken over all tokens of the step, in float64. Both
    are exactly 0.0 when every token is bit-equal; k1 may be negative, k3 never is.
    """
    if not (len(request_ids) == len(rollout) == len(rescored)):
        raise ValueError(f"bitcheck at step {step}: {len(request_ids)} request ids, {len(rollout)} rollout "
                         f"tensors and {len(rescored)} rescored tensors; they must be one per request")
    if max_mismatches < 0:
        raise ValueError(f"max_mismatches must be >= 0, got {max_mismatches}")
    for rid, a, b in zip(request_ids, rollout, rescored):
        for side, t in (("rollout", a), ("rescored", b)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 1:
                what = (f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                        else type(t).__name__)
                raise ValueError(f"bitcheck at step {step}, request {rid!r}: {side} logprobs must be a 1-D "
                                 f"float32 tensor, got a {what}")
        if a.numel() != b.numel():
            raise ValueError(f"bitcheck at step {step}, request {rid!r}: {a.numel()} rollout logprobs but "
                             f"{b.numel()} rescored logprobs")
    lengths = [t.numel() for t in rollout]
    a = _concat(rollout)
    b = _concat(rescored)
    equal = a.view(torch.int32) == b.view(torch.int32)
    n = a.numel()
    n_equal = int(equal.sum())
    sequences_equal = sum(bool(chunk.all()) for chunk in torch.split(equal, lengths)) if lengths else 0
    first: list[dict] = []
    if n_equal < n and max_mismatches > 0:
        starts = list(itertools.accumulate(lengths, initial=0))[:-1]
        for idx in (~equal).nonzero().flatten()[:max_mismatches].tolist():
            req = bisect.bisect_right(starts, idx) - 1  # the last request starting at or before idx
            first.append({"step": step, "request_id": request_ids[req], "position": idx - starts[req],
                          "rollout": float(a[idx]).hex(), "rescored": float(b[idx]).hex(),
                          "rollout_bits": _bits(a[idx]), "rescored_bits": _bits(b[idx])})
    d = a.double() - b.double()  # log p - log q
    if n:
        kl_k1 = float(d.mean())
        kl_k3 = float((torch.expm1(-d) + d).mean())  # exp(r) - 1 - r with r = -d, expm1 for small r
        max_abs_diff = float(d.abs().max())
    else:
        kl_k1 = kl_k3 = max_abs_diff = 0.0
    return {"step": step, "sequences": len(lengths), "sequences_equal": sequences_equal,
            "tokens_compared": n, "tokens_equal": n_equal, "bit_match": n_equal / n if n else 1.0,
            "first_mismatches": first, "max_abs_diff": max_abs_diff, "kl_k1": kl_k1, "kl_k3": kl_k3,
            "sha256_rollout": _sha256(a), "sha256_rescored": _sha256(b)}


def enforce(record: dict, policy: Literal["raise", "warn"]) -> None:
    """Act on a bit-check record: nothing if every token is bit-equal, else raise or warn per `policy`.

    The message names the step, how many tokens differ, and the first mismatch's request id,
    position and both values in hex.
    """
    if policy not in POLICIES:
        raise ValueError(f"on_mismatch policy must be one of {POLICIES}, got {policy!r}")
    if record["tokens_equal"] == record["tokens_compared"]:
        return
    message = mismatch_message(record)
    if policy == "raise":
        raise MismatchError(message, record)
    warnings.warn(message, MismatchWarning, stacklevel=2)


def mismatch_message(record: dict) -> str:
    """One line describing a failed bit-check: counts, the first mismatch, max |Δ| and KL."""
    n, n_equal = record["tokens_compared"], record["tokens_equal"]
    text = (f"bit-check failed at step {record['step']}: {n - n_equal} of {n} tokens differ between rollout "
            f"and rescored logprobs")
    if record["first_mismatches"]:
        m = record["first_mismatches"][0]
        text += (f"; first mismatch: request {m['request_id']!r} position {m['position']}: rollout "
                 f"{m['rollout']} vs rescored {m['rescored']}")
    return text + (f"; max |Δ| {record['max_abs_diff']!r}, KL k1 {record['kl_k1']!r}, "
                   f"k3 {record['kl_k3']!r}")


def _concat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=torch.float32)
    return torch.cat([t.detach().reshape(-1) for t in tensors]).cpu().contiguous()


def _bits(x: torch.Tensor) -> str:
    return f"0x{int(x.view(torch.int32)) & 0xFFFFFFFF:08x}"


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().astype("<f4", copy=False).tobytes()).hexdigest()
