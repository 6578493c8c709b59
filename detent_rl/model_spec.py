"""What a worker needs to build the run's model (`ModelSpec`, derived once from the recipe by the driver), and how a
worker joins its tensor-parallel group and finds its Ray placement group.

The rollout and the trainer workers (`workers.py`) build their models from the same spec, so both select the same
kernels with the same pins; `ModelSpec.check` builds the selections without weights in the driver, so a bad
config or tuple fails there in one line before any worker starts.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.config import ModelConfig
from detent_rl.models.model import CausalLM
from detent_rl.models.parallel import TensorParallel
from detent_rl.models.tp_invariant import tp_invariant_commitments
from detent_rl.weight_sync import SYNC_TIMEOUT

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def placement_group_id() -> Optional[str]:
    """The id of the Ray placement group this worker runs in (None outside one, or outside Ray)."""
    if "ray" not in sys.modules:
        return None
    import ray
    if not ray.is_initialized():
        return None
    pg = ray.util.get_current_placement_group()
    return pg.id.hex() if pg is not None else None


@dataclass(frozen=True)
class ModelSpec:
    """What a worker needs to build the run's model: derived once from the recipe by the driver."""
    path: str
    arm: str
    device: str
    dtype: str
    max_context: int
    max_batch: int
    max_num_tokens: int
    commitment: Optional[str] = None
    threads: int = 0  # CPU: torch threads in this worker (0 = leave torch's default)
    tp_size: int = 1  # tensor-parallel ranks of this worker's model (the trainer's, or each engine's)
    tp_invariant_with: int = 0  # > 1: bits equal between one GPU and this many ranks (models/tp_invariant.py)
    sglang_tile: int = 0  # rollout.backend sglang: SGLang's decode split tile, which the trainer reproduces

    def load(self, device: Optional[str] = None, tp: Optional[TensorParallel] = None) -> CausalLM:
        """The model with its weights (this rank's part with `tp`); on device "meta" without them (what
        `check` uses). With `tp_invariant_with` the commitment is the matching tuple of the pair."""
        if self.device == "cpu" and self.threads and device != "meta":
            torch.set_num_threads(self.threads)
        if (tp.size if tp is not None else 1) != self.tp_size:
            raise ValueError(f"the spec's model is cut over {self.tp_size} tensor-parallel ranks; this load has "
                             f"{tp.size if tp is not None else 1}")
        commitment = CommitmentTuple.load(self.commitment) if self.commitment else None
        if self.tp_invariant_with > 1:
            pair = _invariant_pair(self.path, self.dtype, self.tp_invariant_with, self.max_context, self.max_batch,
                                   self.max_num_tokens)
            commitment = pair[0] if self.tp_size == 1 else pair[1]
        return load_model(self.path, self.arm, device=device or self.device, dtype=DTYPES[self.dtype],
                          commitment=commitment, max_context=self.max_context, max_batch=self.max_batch,
                          max_num_tokens=self.max_num_tokens, tp=tp)

    def check(self) -> None:
        """Builds the model's selections without weights, so a bad config or commitment tuple (another
        deployment, unknown sites, heads that do not divide over the TP ranks) fails here in the driver,
        in one line, before any worker starts."""
        self.load(device="meta", tp=self.meta_tp())

    def meta_tp(self) -> Optional[TensorParallel]:
        """A rank-0 stand-in of this spec's tensor parallelism (for models built without their group)."""
        return TensorParallel(0, self.tp_size, invariant=self.tp_invariant_with > 1) if self.tp_size > 1 else None


@functools.lru_cache(maxsize=None)
def _invariant_pair(path: str, dtype: str, size: int, max_context: int, max_batch: int,
                    max_num_tokens: int) -> tuple[CommitmentTuple, CommitmentTuple]:
    """`tp_invariant_commitments` for a spec, once per process (a worker loads its model, a reference model
    and a layout's meta model from the same pair)."""
    return tp_invariant_commitments(ModelConfig.from_file(Path(path)), DTYPES[dtype], size, max_context=max_context,
                                    max_batch=max_batch, max_num_tokens=max_num_tokens)


def join_tp_group(spec: ModelSpec, address: str, rank: int, world: int) -> TensorParallel:
    """This process as rank `rank` of a tensor-parallel group of `world` at `address` (its rank 0's):
    torch.distributed's default group of the process (NCCL on the GPU, gloo on the CPU)."""
    import torch.distributed as dist
    if spec.device == "cuda":
        torch.cuda.set_device(0)  # Ray shows the actor its own GPU only
    dist.init_process_group("nccl" if spec.device == "cuda" else "gloo", init_method=f"tcp://{address}",
                            rank=rank, world_size=world, timeout=SYNC_TIMEOUT)
    return TensorParallel.from_group(invariant=spec.tp_invariant_with > 1)
