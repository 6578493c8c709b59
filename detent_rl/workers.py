"""The two workers of a run — rollout (the engine) and trainer — and the typed values they exchange.

Both build their model from the same `ModelSpec` (`model_spec.py`: checkpoint directory, arm, dtype,
limits, commitment tuple), so both select the same kernels with the same pins. `detent_rl.group` runs each
as Ray actors or in the driver's process. The trainer's compute weights travel to the engine after
every update as a `WeightUpdate` with their digest (`weights_digest`, computed on the trainer's
device); the rollout worker recomputes it over what it then holds, on its device, and refuses a
mismatch naming the tensors that differ. In one process (`ray.mode: inline`) the update carries the
trainer's live device tensors and the engine copies them device to device; between Ray actors it
carries host copies through Ray's object store.

With `model.tp_size` > 1 every engine and the trainer are groups of that many ranks (Ray actors, each
its own torch.distributed group: `start_tp`), each holding its part of the model
(`models/parallel.py`); every call goes to all ranks of a group and rank 0's result is taken (the
ranks' results are equal: the logits are gathered before sampling and scoring), and trainer rank r's
part goes to rank r of every engine.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from detent_rl.config import RolloutSection, TrainSection
from detent_rl.ipc import CudaIpcTensors, device_uuid
from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.kernels.sampling import unfiltered
from detent_rl.model_spec import DTYPES, ModelSpec, join_tp_group, placement_group_id
from detent_rl.models.model import CausalLM
from detent_rl.models.tp_invariant import ShardLayout
from detent_rl.models.weights import weights_digest
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.trainer.stock import StockTrainer
from detent_rl.trainer.trainer import Sample, Trainer, TrainStats
from detent_rl.weight_sync import TRANSPORTS, SyncGroup, WeightManifest, WeightUpdate, sync_address


@dataclass(frozen=True)
class GenerateRequest:
    prompts: list[list[int]]
    params: list[SamplingParams]


@dataclass(frozen=True)
class Completion:
    """One finished request: prompt + completion tokens and the completion's sampled-token logprobs."""
    tokens: list[int]
    num_prompt: int
    logprobs: list[float]
    num_cached: int  # prompt tokens served from the prefix cache


def deal(num_requests: int, group_size: int, num_engines: int) -> list[list[int]]:
    """Request indices per engine: the requests come in groups of `group_size` consecutive ones (a
    prompt's GRPO samples, which share its prefix cache), dealt whole, group g to engine g mod N. A
    fixed function of the shapes, so a request's engine is known before anything runs; its bits do not
    depend on it (every engine runs the same pinned kernels, and a request samples from its own seed)."""
    if num_engines < 1 or group_size < 1:
        raise ValueError(f"deal: {num_engines} engines, groups of {group_size}: both must be >= 1")
    out: list[list[int]] = [[] for _ in range(num_engines)]
    for start in range(0, num_requests, group_size):
        out[(start // group_size) % num_engines].extend(range(start, min(start + group_size, num_requests)))
    return out


def generate(rollout: Any, request: GenerateRequest, group_size: int = 1, tp_size: int = 1) -> list[Completion]:
    """`request` on the rollout group's engines (data parallel, dealt by `deal`), the completions back in
    request order. With `tp_size` > 1 the group's workers are engines' ranks (engine e: workers e * tp_size
    onwards): every rank of an engine takes its share, and its rank 0's completions are kept."""
    shares = deal(len(request.prompts), group_size, len(rollout) // tp_size)
    calls = [(GenerateRequest([request.prompts[i] for i in idx], [request.params[i] for i in idx]),) if idx else None
             for idx in shares]
    results = iter(rollout.get(rollout.async_each("generate", [c for c in calls for _ in range(tp_size)])))
    out: list[Optional[Completion]] = [None] * len(request.prompts)
    for idx in shares:
        if idx:
            ranks = [next(results) for _ in range(tp_size)]
            for i, c in zip(idx, ranks[0]):
                out[i] = c
    return out  # type: ignore[return-value]


class RolloutWorker:
    def __init__(self, spec: ModelSpec, rollout: RolloutSection) -> None:
        self.spec, self.rollout = spec, rollout
        self._layouts: dict[int, ShardLayout] = {}  # how a trainer of another degree cuts the weights
        if spec.tp_size == 1:
            self._build(spec.load())
        # else `start_tp` builds this rank's part once every rank knows the group's address

    def start_tp(self, address: str, rank: int, world: int) -> None:
        """Rank `rank` of this engine's tensor-parallel group at `address`, then its part of the model."""
        self._build(self.spec.load(tp=join_tp_group(self.spec, address, rank, world)))

    def sync_address(self) -> str:
        return sync_address()

    def _build(self, model: CausalLM) -> None:
        spec, rollout = self.spec, self.rollout
        self.model = model
        batch = rollout.prompts_per_step * rollout.samples_per_prompt
        num_seqs = min(rollout.max_num_seqs, spec.max_batch)
        # enough pages for every sequence the engine runs at once at full context, plus slack
        blocks = rollout.num_blocks or min(num_seqs, batch) * -(-spec.max_context // self.model.page_size) + 8
        self.engine = Engine(self.model, num_blocks=blocks, max_num_seqs=num_seqs, chunk_size=rollout.chunk_size,
                             cuda_graphs=rollout.graphs(),
                             step_graphs=rollout.pieces(self.model.device.type),
                             full_steps=rollout.whole(self.model.device.type),
                             releasable=rollout.release_memory)  # (the cache's addresses kept across releases)
        self.warmup: dict | None = None  # `Engine.warmup`'s report, where it ran
        if rollout.warmup == "on" or (rollout.warmup == "auto" and self.model.device.type == "cuda"):
            # the decode graphs that sample at the rollout's temperature and the greedy evaluation's (T = 1);
            # filtered rows (top-k, top-p) take the graphs that return logits
            filtered = not unfiltered(rollout.temperature, rollout.top_k, rollout.top_p)
            temps = {rollout.temperature if rollout.temperature > 0 else 1.0, 1.0}
            self.warmup = self.engine.warmup(tuple(sorted(temps)) + ((None,) if filtered else ()))

    def generate(self, request: GenerateRequest) -> list[Completion]:
        seqs = self.engine.generate(request.prompts, request.params)
        return [Completion(s.tokens, s.num_prompt, s.logprobs, s.num_cached) for s in seqs]

    def release_memory(self) -> int:
        """Frees the engine's KV cache until its next generate (`Engine.release_memory`); bytes freed."""
        freed = self.engine.release_memory()
        if torch.cuda.is_available() and next(self.model.parameters()).is_cuda:
            torch.cuda.empty_cache()  # back to the device, for the colocated trainer
        return freed

    def update_weights(self, update: WeightUpdate) -> str:
        """Copy the update in and check it: the digest of what the engine now holds must be the one the
        trainer computed over what it sent. Returns the digest's hex."""
        self.engine.update_weights(update.weights)
        got = weights_digest(self.model, update.digest.key)
        if got != update.digest:
            bad = got.differing(update.digest)
            raise RuntimeError(f"weight sync: the rollout engine's weights differ from the trainer's in {len(bad)} "
                               f"tensor(s): {', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''} (digest "
                               f"{got.hex} vs {update.digest.hex})")
        return got.hex

    def reshard_weights(self, trainer_tp: int, *updates: WeightUpdate) -> str:
        """The trainer's weights from a trainer of another tensor-parallel degree (`model.tp_invariant`): the
        parts of its `trainer_tp` ranks joined into this one-GPU engine's whole weights, or a one-GPU
        trainer's whole weights cut to this engine rank's part. Checked on both sides: each update's digest
        over what arrived, then the trainer's digests over what the engine now holds (cut the trainer's
        way). Returns the trainer's digest(s)."""
        for u in updates:
            if weights_digest(u.weights, u.digest.key) != u.digest:
                raise RuntimeError("weight sync: an update's tensors differ from what the trainer digested")
        if trainer_tp > 1:
            layout = self._layout(trainer_tp)
            self.engine.update_weights(layout.join([u.weights for u in updates]))
            held = {n: p.detach() for n, p in self.model.named_parameters()}
            bad = [r for r, u in enumerate(updates) if weights_digest(layout.split(held, r), u.digest.key) != u.digest]
            if bad:
                raise RuntimeError(f"weight sync: the engine's weights cut the trainer's way differ from trainer "
                                   f"rank(s) {bad}'s")
            return ",".join(u.digest.hex for u in updates)
        (u,) = updates
        part = ShardLayout(self.model).split(u.weights, self.model.tp.rank)
        self.engine.update_weights(part)
        if weights_digest(self.model, u.digest.key) != weights_digest(part, u.digest.key):
            raise RuntimeError(f"weight sync: engine rank {self.model.tp.rank}'s weights differ from its part of "
                               f"the trainer's")
        return u.digest.hex

    def _layout(self, size: int) -> ShardLayout:
        """How a model of `size` ranks is cut (from one built on "meta", once)."""
        if size not in self._layouts:
            other = dataclasses.replace(self.spec, tp_size=size)
            self._layouts[size] = ShardLayout(other.load(device="meta", tp=other.meta_tp()))
        return self._layouts[size]

    def join_sync_group(self, address: str, rank: int, world: int) -> None:
        self.sync_group = SyncGroup(address, rank, world, next(self.model.parameters()).device)

    def receive_weights(self, manifest: WeightManifest) -> str:
        """The trainer's broadcast (`TrainerWorker.broadcast_weights`, in manifest order) into fresh
        buffers on the engine's device, then copied in and checked like `update_weights`."""
        device = next(self.model.parameters()).device
        buffers = {}
        for name, shape, dtype in zip(manifest.names, manifest.shapes, manifest.dtypes):
            buffers[name] = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            self.sync_group.broadcast(buffers[name])
        return self.update_weights(WeightUpdate(buffers, manifest.digest))

    def device_uuid(self) -> str | None:
        """The UUID of the engine's GPU (None on the CPU)."""
        device = next(self.model.parameters()).device
        return device_uuid(device.index) if device.type == "cuda" else None

    def commitment(self) -> CommitmentTuple:
        """Every call site's pins and knobs as this engine runs them (defaults included)."""
        return self.model.selections.resolved()

    def pid(self) -> int:
        return os.getpid()

    def placement_group(self) -> Optional[str]:
        return placement_group_id()


class TrainerWorker:
    def __init__(self, spec: ModelSpec, train: TrainSection) -> None:
        self.spec, self.train_section, self.tp_rank = spec, train, None
        if spec.arm == "stock":  # what a user runs instead: transformers' model, autocast, cuBLAS, SDPA
            self.model = spec.load(device="meta")  # the engine's layout, for the weights it is sent
            self.trainer: Trainer = StockTrainer(spec.path, self.model, train, spec.device, DTYPES[spec.dtype],
                                                 spec.max_num_tokens)
            return
        if spec.tp_size > 1:
            return  # `start_tp` builds this rank's part once every rank knows the group's address
        self.model = spec.load()
        self.ref = spec.load() if train.loss.kl_coef else None  # frozen reference: the starting weights
        if train.zero_stage is None:
            self.trainer = Trainer(self.model, train, self.ref)
            if spec.sglang_tile:  # the rollout is SGLang's: recompute its rows with its kernels
                self.trainer.sglang = (spec.sglang_tile, spec.max_context)
        # else `start_zero` builds the ZeRO trainer once every rank knows the group's address

    def start_tp(self, address: str, rank: int, world: int) -> None:
        """Rank `rank` of the trainer's tensor-parallel group at `address`, then its part of the model (and
        of the reference model) and its trainer."""
        tp = join_tp_group(self.spec, address, rank, world)
        self.tp_rank = rank
        self.model = self.spec.load(tp=tp)
        self.ref = self.spec.load(tp=tp) if self.train_section.loss.kl_coef else None
        self.trainer = Trainer(self.model, self.train_section, self.ref)

    def start_zero(self, address: str, rank: int, world: int) -> None:
        """Rank `rank` of the trainer's ZeRO group (`train.zero_stage`): the torch.distributed group at
        `address` (rank 0's), then DeepSpeed over this rank's model (`trainer.zero.ZeroTrainer`)."""
        import deepspeed
        from detent_rl.trainer.zero import ZeroTrainer
        device = next(self.model.parameters()).device
        host, port = address.rsplit(":", 1)  # DeepSpeed also reads the group from the environment
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR=host, MASTER_PORT=port)
        if device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False,
                                   init_method=f"tcp://{address}", rank=rank, world_size=world)
        self.trainer = ZeroTrainer(self.model, self.train_section, self.ref, stage=self.train_section.zero_stage)

    def rescore(self, samples: list[Sample]) -> list[torch.Tensor]:
        return self.trainer.rescore(samples)

    def train(self, samples: list[Sample], old: list[torch.Tensor]) -> TrainStats:
        return self.trainer.train(samples, old)

    def train_checked(self, samples: list[Sample]) -> tuple[TrainStats, list[torch.Tensor]]:
        return self.trainer.train_checked(samples)

    def train_rollout_old(self, samples: list[Sample]) -> tuple[TrainStats, list[torch.Tensor]]:
        return self.trainer.train_rollout_old(samples)

    def weights(self, transport: str = "host") -> WeightUpdate:
        """The compute weights and their digest (taken on the device, before any copy), for the engine to
        copy in and check. `transport`: "host" copies (between processes on different devices), "device"
        (the live tensors themselves, for an engine in this process: see `Trainer.compute_weights`), or
        "ipc" (the live tensors as CUDA IPC handles, for an engine's process on the same GPU)."""
        if transport not in TRANSPORTS:
            raise ValueError(f"weights: transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        live = self.trainer.compute_weights(on_device=True)
        digest = weights_digest(live)
        if transport == "host":
            return WeightUpdate({n: t.cpu() for n, t in live.items()}, digest)
        return WeightUpdate(CudaIpcTensors(live) if transport == "ipc" else live, digest)

    def sync_address(self) -> str:
        return sync_address()

    def join_sync_group(self, address: str, rank: int, world: int) -> None:
        self.sync_group = SyncGroup(address, rank, world, self.trainer.weights_device)

    def weights_manifest(self) -> WeightManifest:
        """The collective sync's first half: the compute weights' names, shapes, dtypes and digest (taken
        on the device); `broadcast_weights` then sends these very tensors, which no update changes between."""
        live = self.trainer.compute_weights(on_device=True)
        names = tuple(sorted(live))
        self._broadcast = [live[n] for n in names]
        return WeightManifest(names, tuple(tuple(t.shape) for t in self._broadcast),
                              tuple(str(t.dtype).removeprefix("torch.") for t in self._broadcast), weights_digest(live))

    def broadcast_weights(self) -> int:
        """The collective sync's second half: every tensor of the last manifest from rank 0, in its order;
        the number sent."""
        sent, self._broadcast = self._broadcast, []
        for t in sent:
            self.sync_group.broadcast(t.contiguous())
        return len(sent)

    def device_uuid(self) -> str | None:
        """The UUID of the GPU holding the weights (None on the CPU): the driver syncs by IPC when the
        engine's is the same."""
        device = self.trainer.weights_device
        return device_uuid(device.index) if device.type == "cuda" else None

    def commitment(self) -> CommitmentTuple:
        """What the trainer runs; with `rollout.backend: sglang` the SGLang worker's tuple (its split tile too)."""
        from detent_rl.rollout.sglang_worker import commitment_for_sglang
        tile = self.spec.sglang_tile
        return commitment_for_sglang(self.model.selections, tile) if tile else self.model.selections.resolved()

    def save_state(self, path: str | os.PathLike) -> None:
        """Writes the trainer's state (masters, optimizer, schedule) to `path`, streamed from the live tensors
        (a tensor-parallel rank its part, as `path`/tp_rank<r>.pt)."""
        self.trainer.save_state(self._state_path(path, create=True))

    def load_state(self, path: str | os.PathLike) -> None:
        self.trainer.load_state(self._state_path(path))

    def _state_path(self, path: str | os.PathLike, create: bool = False) -> Path:
        if self.tp_rank is None:
            return Path(path)
        if create:
            Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path) / f"tp_rank{self.tp_rank}.pt"

    def pid(self) -> int:
        return os.getpid()

    def placement_group(self) -> Optional[str]:
        return placement_group_id()
