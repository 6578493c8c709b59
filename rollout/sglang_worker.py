"""`rollout.backend: sglang`: the run's rollout by SGLang's own engine, driven through its public API, with
detent_rl's plugin pinning it; the trainer reproduces its logprobs (`completion_logprobs(..., sglang=)`).

The worker, in the rollout worker's place (same calls as `workers.RolloutWorker`):

- **Start.** The trainer's selections for the run's deployment (the model built on "meta": the same
  tuple file, defaults included) and SGLang's Triton decode split tile are written to one commitment
  tuple; `$DETENT_COMMITMENT` names it for every process SGLang starts, whose plugin entry point loads
  it (selection pins, and the model's kernels: `rollout/sglang_model.py`). Then `sglang.Engine` with the
  Triton attention backend, token ids in and out (`skip_tokenizer_init`), the deployment's limits
  (context, running requests, chunked-prefill tokens = the selections' token bound), SGLang's own
  process-wide deterministic mode off (the plugin pins what it would, and more).
- **generate.** `Engine.generate(input_ids=..., sampling_params=[...], return_logprob=True)`, each
  request with its own `sampling_seed` (the plugin refuses a request without one), EOS left to the
  request's stop tokens as in our engine (`ignore_eos`). Each output's `output_ids` and
  `meta_info["output_token_logprobs"]` (logprob, token id, text) become a Completion.
- **update_weights.** The trainer's tensors (fused q/k/v and gate/up split back into checkpoint names,
  which SGLang's loaders stack again) by `Engine.update_weights_from_tensor`, which also flushes the
  prefix cache. Checked: the tensors sent digest to the trainer's digest. SGLang's public API cannot
  read a Qwen2 model's weights back (its `get_weights_by_name` is implemented for Llama only), so what
  proves the engine holds them is the next step's bit-check: every rollout logprob must equal the
  trainer's recomputation, which no other weights give.

Status: run end to end on the H200 with SGLang 0.5.17 (sglang-kernel 0.4.5, torch 2.11; session 26,
docs/BENCHMARKS.md): the engine started with the plugin, rolled out 16 requests a step with CUDA graphs,
took a weight update, and every rollout logprob of both steps equalled the trainer's recomputation
(tests/test_sglang_engine_gpu.py; control: the trainer's own attention misses them). 0.5.23's CUDA
kernels do not load beside the device's torch 2.11, so on 0.5.23 it is tested on the CPU only, against
SGLang's own argument, sampling-parameter and weight-name handling (tests/test_sglang_worker.py).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from detent_rl.kernels.commitment import CommitmentTuple, SiteCommitment
from detent_rl.models.loader import checkpoint_name
from detent_rl.models.weights import weights_digest
from detent_rl.rollout import sglang_plugin as P
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.weight_sync import WeightUpdate

MEM_FRACTION = 0.5  # weights + KV pool: half the GPU, the other half the colocated trainer's


def engine_args(spec: Any, rollout: Any) -> dict:
    """`sglang.Engine`'s keyword arguments (ServerArgs fields) for a run's model spec and rollout section."""
    return dict(model_path=spec.path, dtype=spec.dtype, attention_backend="triton", sampling_backend="pytorch",
                skip_tokenizer_init=True, context_length=spec.max_context,
                max_running_requests=min(rollout.max_num_seqs, spec.max_batch),
                chunked_prefill_size=min(rollout.chunk_size, spec.max_num_tokens),
                max_prefill_tokens=spec.max_num_tokens, random_seed=0, enable_deterministic_inference=False,
                disable_cuda_graph=rollout.cuda_graphs == "off", log_level="error", mem_fraction_static=MEM_FRACTION)


def sampling_params(p: SamplingParams) -> dict:
    """SGLang's sampling parameters of one of our requests (temperature 0 is greedy in both)."""
    return {"max_new_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
            "top_k": p.top_k if p.top_k > 0 else -1, "sampling_seed": p.seed, "ignore_eos": True,
            "stop_token_ids": list(p.stop_token_ids) or None, "skip_special_tokens": False}


def completion(prompt: list[int], output: dict) -> tuple[list[int], int, list[float], int]:
    """(tokens, prompt length, the completion's logprobs, cached prompt tokens) of one SGLang output."""
    ids = list(output["output_ids"])
    meta = output["meta_info"]
    entries = meta["output_token_logprobs"]
    if [int(e[1]) for e in entries] != ids:
        raise RuntimeError(f"SGLang returned logprobs for tokens {[e[1] for e in entries][:8]}... but output ids "
                           f"{ids[:8]}...: ask for return_logprob with logprob_start_len left unset")
    return list(prompt) + ids, len(prompt), [float(e[0]) for e in entries], int(meta.get("cached_tokens", 0))


def checkpoint_tensors(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Our weights by checkpoint (HF) name: each fused q/k/v or gate/up tensor cut back into its shards."""
    modules = dict(model.named_modules())
    out = []
    for name, t in weights.items():
        owner = modules.get(name.rsplit(".", 1)[0])
        offsets = getattr(owner, "offsets", None)
        if offsets is None:
            out.append((name, t))
            continue
        for shard, (start, rows) in offsets.items():
            out.append((checkpoint_name(name, shard), t.narrow(0, start, rows)))
    return out


def commitment_for_sglang(selections: Any, tile: int) -> CommitmentTuple:
    """The trainer's tuple (every site it runs, this deployment) plus SGLang's decode split tile."""
    base = selections.resolved()
    sites = dict(base.sites)
    sites[P.SITE] = SiteCommitment({}, {"split_tile_size": tile})
    return CommitmentTuple(sites, base.deployment)


class SGLangRolloutWorker:
    """A rollout worker whose engine is SGLang's (see the module's docstring)."""

    def __init__(self, spec: Any, rollout: Any, **engine_overrides: Any) -> None:
        P.check_version()
        if spec.tp_size != 1:
            raise ValueError("rollout.backend: sglang runs one GPU per engine here (SGLang's TP is pinned by the "
                             "plugin, but the worker does not start it yet)")
        self.model = spec.load(device="meta")  # the selections and parameter layout, no weights
        self.tuple = commitment_for_sglang(self.model.selections, spec.sglang_tile)
        path = Path(tempfile.mkdtemp(prefix="detent_sglang_")) / "commitment.json"
        self.tuple.save(path)
        os.environ[P.ENV_COMMITMENT] = str(path)  # SGLang's processes inherit it
        import sglang
        self.engine = sglang.Engine(**{**engine_args(spec, rollout), **engine_overrides})

    def generate(self, request: Any) -> list[Any]:
        from detent_rl.workers import Completion
        outs = self.engine.generate(input_ids=[list(p) for p in request.prompts],
                                    sampling_params=[sampling_params(p) for p in request.params], return_logprob=True)
        return [Completion(*completion(p, o)) for p, o in zip(request.prompts, outs)]

    def update_weights(self, update: WeightUpdate) -> str:
        if weights_digest(update.weights, update.digest.key) != update.digest:
            raise RuntimeError("weight sync: the tensors to send to SGLang differ from what the trainer digested")
        self.engine.update_weights_from_tensor(named_tensors=checkpoint_tensors(self.model, update.weights),
                                               flush_cache=True)
        return update.digest.hex

    def commitment(self) -> CommitmentTuple:
        return self.tuple

    def device_uuid(self) -> None:
        return None  # SGLang's own processes hold the GPU: weights go by host copies (update_weights)

    def pid(self) -> int:
        return os.getpid()

    def placement_group(self) -> Optional[str]:
        from detent_rl.model_spec import placement_group_id
        return placement_group_id()

    def shutdown(self) -> None:
        self.engine.shutdown()
