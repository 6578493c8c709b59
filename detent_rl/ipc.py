"""CUDA tensors handed between processes that share a GPU by IPC handle: no copy through the host.

The weight sync between Ray actors on one GPU (a colocated trainer and engine): the trainer's worker
returns its live compute weights as a `CudaIpcTensors`, which pickles as torch.multiprocessing's CUDA
IPC handles (a few hundred bytes a tensor); the engine's process maps the trainer's memory when it
unpickles them and copies device to device. The trainer's tensors must stay alive and unchanged until
the engine has copied them — the sync runs between the trainer's update and its next one, and the
driver waits for the engine — and both processes must see the GPU, by its UUID, under one index.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import reduce_tensor


def device_uuid(index: int | None = None) -> str:
    """The UUID of a CUDA device (the current one by default): the same GPU whatever its index."""
    return str(torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).uuid)


class CudaIpcTensors(dict):
    """A name -> CUDA tensor map that pickles as CUDA IPC handles; unpickled it is a plain dict of
    tensors that view the sender's memory. In the sender's own process it is just the dict."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        off = [n for n, t in tensors.items() if not t.is_cuda]
        if off:
            raise ValueError(f"CUDA IPC hands over CUDA tensors only; not on a GPU: {', '.join(off[:5])}")
        super().__init__(tensors)

    def __reduce__(self):
        uuids = {t.device.index: device_uuid(t.device.index) for t in self.values()}
        return _open, ([(n, reduce_tensor(t)) for n, t in self.items()], uuids)


def _open(items: list, uuids: dict[int, str]) -> dict[str, torch.Tensor]:
    for index, uuid in uuids.items():
        if index >= torch.cuda.device_count() or device_uuid(index) != uuid:
            raise RuntimeError(f"CUDA IPC: this process does not see the sender's GPU {uuid} as cuda:{index} "
                               f"(the workers must share a GPU under one index; otherwise sync through host "
                               f"copies)")
    return {n: rebuild(*args) for n, (rebuild, args) in items}
