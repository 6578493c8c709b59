"""How the trainer's weights travel to the engines: the typed values (`WeightUpdate`, `WeightManifest`) and
the broadcast group of a collective sync (`SyncGroup`, at an address from `sync_address`). The workers
(`workers.py`) send and check them; the driver (`train.py`) picks the transport.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch

from detent_rl.models.weights import WeightsDigest


TRANSPORTS = ("host", "device", "ipc")  # by value; "collective" is `weights_manifest` + `broadcast_weights`


@dataclass(frozen=True)
class WeightManifest:
    """What a collective sync sends ahead of the broadcast (through Ray; small): the tensors in broadcast
    order, with their shapes and dtypes, and the trainer's digest of them."""
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    digest: WeightsDigest


SYNC_TIMEOUT = datetime.timedelta(minutes=10)


class SyncGroup:
    """The weight-sync group (the trainer's rank 0 is rank 0, engine i rank i + 1): a process group of its
    own over a TCP store at `address` (rank 0 hosts it), beside torch.distributed's default group, which
    a ZeRO trainer's ranks hold; NCCL for CUDA weights, gloo on the CPU. Built by every member at once:
    it blocks until all have joined."""

    def __init__(self, address: str, rank: int, world: int, device: torch.device) -> None:
        import torch.distributed as dist
        host, port = address.rsplit(":", 1)
        store = dist.PrefixStore("detent_rl.weight_sync",
                                 dist.TCPStore(host, int(port), world, rank == 0, timeout=SYNC_TIMEOUT))
        if device.type == "cuda":
            torch.cuda.set_device(device)
            self.group = dist.ProcessGroupNCCL(store, rank, world)  # NCCL's own timeout: 10 minutes
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world, SYNC_TIMEOUT)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """`tensor` from rank 0 into every member's `tensor`; waits until it has arrived (a peer that died
        mid-broadcast ends the wait after SYNC_TIMEOUT instead of never)."""
        self.group.broadcast(tensor, 0).wait()


def sync_address() -> str:
    """host:port for the sync group's rendezvous, on this worker's node: its IP and a port free now."""
    import socket
    try:
        import ray
        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except ImportError:
        host = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        return f"{host}:{s.getsockname()[1]}"


@dataclass(frozen=True)
class WeightUpdate:
    """The trainer's compute weights by the model's own names, and their `weights_digest`."""
    weights: dict[str, torch.Tensor]
    digest: WeightsDigest
