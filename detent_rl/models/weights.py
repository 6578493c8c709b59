"""The identity of a set of weights: one sha256 that the trainer and the engine compute alike.

After every update the trainer sends its compute weights with this hash and the engine recomputes it
over what it then holds, so a sync that lost, reordered or re-rounded anything is caught by name.
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import torch


def weights_sha256(named: Mapping[str, torch.Tensor] | torch.nn.Module) -> str:
    """sha256 over (name, dtype, shape, sha256 of the bytes) of every weight in name order.

    The tensors' own digests run in threads (hashlib releases the GIL on large buffers), each as soon
    as its bytes are on the host, so a 0.5B model hashes in a fraction of a serial pass."""
    items = dict(named.named_parameters()) if isinstance(named, torch.nn.Module) else named
    names = sorted(items)

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).hexdigest()

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        jobs = {}
        for n in names:
            t = items[n].detach().contiguous().cpu()
            jobs[n] = (t.dtype, tuple(t.shape), pool.submit(digest, t))
    h = hashlib.sha256()
    for n in names:
        dtype, shape, job = jobs[n]
        h.update(f"{n}|{dtype}|{shape}|{job.result()}\n".encode())
    return h.hexdigest()
