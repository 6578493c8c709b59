"""DETENT for SGLang: one plugin that pins SGLang's own kernel selection through SGLang's hook registry.

SGLang runs `sglang.srt.plugins.load_plugins()` in every process it starts (the engine, the scheduler
subprocess, the DP controller): it loads each `sglang.srt.plugins` entry point, calls it, and applies
the hooks registered meanwhile. detent_rl registers `detent = detent_rl.rollout.sglang_plugin:register`
(pyproject.toml), so installing detent_rl beside SGLang is enough; `register()` can also be called
by hand (then `HookRegistry.apply_hooks()`, or `load_plugins()`, patches the classes). Only the SGLang
versions in SUPPORTED_VERSIONS are accepted: the hook targets and the selection transcriptions
(`kernels/programs/sglang/`) are checked against those (tests/test_sglang_plugin.py, against the
real package); another version is refused by name before any hook is registered. 0.5.23 is the
release transcribed; 0.5.17 is the torch-2.11 stack's (its CUDA kernels load beside torch 2.11), where
the Triton split count, FA3, FlashInfer, the sampler and the model's kernels are pinned as below, and
the two selections transcribed from 0.5.23 alone (TRANSCRIBED_FOR: the fused-MoE row, the TP
all-reduce) are refused before their kernels run.

What it pins now:

- **Triton attention backend, decode split-KV.** Stock SGLang picks each request's number of KV
  splits from the whole batch (`get_num_kv_splits_triton`: the longest and shortest lengths, the
  request count, the SM count), so a request's attention output changes bits with its neighbours.
  With the plugin a request's split count comes from its own KV length and a fixed split tile,
  `ceil(len / tile)` — SGLang's own deterministic path, without the rest of its deterministic mode —
  and the split buffers hold `ceil(context / tile)` splits. The backend's prefill takes its
  deterministic extend path (the unified one-stage kernel: chunked prefill and prefix hits keep a
  prompt row's bits) and SGLang's work-stealing Lean decode (ROCm) is off. The trainer reproduces
  these rows with the same two kernels (`rollout/sglang_attention.py`). Both counts come from the
  transcribed selection
  program (`triton_decode_num_kv_splits`) solved for the backend's facts on that path: the solver
  finds nothing left to pin there (the count reads only the request's own length) and the committed
  selector gives `max_kv_splits`; the tile is the program's knob `split_tile_size`, read from the
  commitment tuple (site SITE; the program's default, 256, without one).
- **Fused-MoE config row.** Stock SGLang picks the MoE kernel's config from the token count M (the
  tuned table's row nearest M, or a default by M), so a token's expert GEMMs change tiles with the
  batch. The transcribed program (`fused_moe_config`) solved for the call's deployment (device, E, N,
  dtype, block shape, Triton version, whether SGLang ships a table) has one pin — the table row
  (`table_key`), or on the default path the small-M switch — committed from the tuple's site
  MOE_SITE or the solver's default. The hook hands SGLang's own `try_get_optimal_moe_config` a token
  count whose stock selection is the committed one, so every M gets that config (and the down GEMM
  its row); a deployment whose shipped table is not transcribed is refused by the program.
- **Request-bound sampling.** A request must carry `sampling_seed` (refused when SGLang validates
  its sampling parameters, never given 42 as SGLang's deterministic mode does), and every batch
  samples with SGLang's seeded sampler (`multinomial_with_seed`: a hash of seed, position and
  column), whatever the batch.

- **FA3 backend.** One KV split in prefill and decode (its splits are equal parts of a row's length,
  so only one keeps the bits): SGLang's own deterministic setting without its process-wide mode; not
  yet checked on a GPU here, and the trainer-side reproduction below exists for the Triton backend
  only. FA4 (the same class) is refused.
- **FlashInfer backend.** One KV split in prefill and decode. Its `__init__` builds the decode
  wrappers with the tensor-core choice and sizes the workspace, and its prefill leaves the ragged
  (prefix-less) kernel for the paged one only under SGLang's deterministic flag, so the hook runs
  `__init__` with that flag in force (SGLang's scoped override; the process-wide mode stays off) and
  SGLang's split-tile variables set to the context length: SGLang's own deterministic path (tensor-core
  decode, paged prefill with or without a prefix, fixed split sizes, no split-KV in its CUDA graphs),
  with a tile that leaves one split. One split, because the captured graphs plan decode without
  split-KV while eager decode splits at the tile: only a tile covering the context makes the two
  agree. Checked on the CPU against SGLang's runtime context; not run on a GPU (FlashInfer is not
  on the device), and no trainer-side reproduction (the trainer reproduces the Triton backend).
- **Tensor-parallel all-reduce (TP > 1).** SGLang's custom all-reduce v2 picks one of five algorithms
  by message size (`_pick_config`), each adding the ranks' partial sums in its own order, and hands
  oversized, unaligned or strided messages to NCCL. The transcribed program (`custom_allreduce_v2`),
  solved for the group (ranks, compute capability, multicast, workspace sizes; messages are whole
  16-byte granules up to the largest workspace), has one pin, the plan; the plugin commits it (the
  tuple's site AR_SITE, else the plan SGLang takes for the largest message when it is legal for all)
  and SGLang's own dispatch runs it for every size. A message the plan cannot hold, one NCCL would
  take, or a group whose all-reduce goes to another communicator (mscclpp, FlashInfer's fusion,
  custom all-reduce off) is refused before any kernel runs (`rollout/sglang_allreduce.py`). Checked on
  the CPU against SGLang's own constructor and dispatch (tests/test_sglang_allreduce.py); no multi-GPU
  run yet.

- **The model's kernels** (`rollout/sglang_model.py`), with a tuple that records its deployment: the
  dense linears and the LM head by our pinned linear, RMSNorm, SiluAndMul and the rotary embedding by
  our kernels, the sampler on its deterministic (log_softmax) path — the kernels the trainer runs.

The trainer's side of the attention is `rollout/sglang_attention.py` (SGLang's two kernels, each row
the way the rollout computed it); of the logprobs, `sglang_model.token_logprobs`.
"""
from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
from typing import Any, Optional

import torch

from detent_rl.kernels.commitment import CommitmentError, CommitmentTuple
from detent_rl.kernels.programs.sglang import moe_config as MOE
from detent_rl.kernels.programs.sglang import triton_decode as TD
from detent_rl.selir.errors import SelectionError, SelIRError
from detent_rl.selir.solver import solve

# 0.5.17: the torch-2.11 stack (its sglang-kernel 0.4.5 loads beside torch 2.11; it needs transformers < 5.13);
# 0.5.23: the newest release transcribed. Each is checked against its real package (tests/test_sglang_*.py).
SUPPORTED_VERSIONS = ("0.5.17", "0.5.23")
# Pins whose selection code was transcribed from one release only (kernels/programs/sglang/): on another
# supported release the plugin refuses the path (a fused-MoE layer; an all-reduce over more than one rank)
# before any of its kernels runs. 0.5.17's MoE tables and its custom all-reduce (`_pick_algo`) differ.
TRANSCRIBED_FOR = {"fused_moe": ("0.5.23",), "allreduce": ("0.5.23",)}
# The FlashAttention-3 backend's split-count fields (0.5.17 has one for prefill and decode).
FA3_SPLIT_FIELDS = {"0.5.17": ("num_splits",), "0.5.23": ("num_splits", "decode_num_splits")}
TRITON_BACKEND = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
FA3_BACKEND = "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend"
FLASHINFER_BACKEND = "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend"
FLASHINFER_TILES = ("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE")
SAMPLING_PARAMS = "sglang.srt.sampling.sampling_params.SamplingParams"
SAMPLING_BATCH = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo"
MOE_CONFIG = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config.try_get_optimal_moe_config"
ALLREDUCE = "sglang.srt.distributed.device_communicators.custom_all_reduce_v2.CustomAllReduceV2"
GROUP = "sglang.srt.distributed.parallel_state.GroupCoordinator"
SITE = "sglang.triton_decode"  # the commitment tuple's site of the Triton decode split tile
MOE_SITE = "sglang.fused_moe"  # ... and of the fused-MoE config row (pins of `fused_moe_config`)
AR_SITE = "sglang.custom_allreduce"  # ... and of the TP all-reduce plan (pin `plan` of `custom_allreduce_v2`)
AR_GRANULE = 16  # custom all-reduce takes whole 16-byte granules (SGLang sends others to NCCL)
MOE_MAX_TOKENS = 1 << 16  # the MoE program's bound on tokens per call (a fact it only assumes)
ENV_COMMITMENT = "DETENT_COMMITMENT"  # a commitment tuple file for processes SGLang starts
MAX_NUM_SEQ = 1 << 16  # the selection program's bound on requests per call (a fact it only assumes)


class SGLangPluginError(RuntimeError):
    """The plugin cannot pin this SGLang: an unsupported version or an unusable commitment tuple."""


def check_version(version: Optional[str] = None) -> str:
    """The installed SGLang's version, if the plugin supports it; otherwise a clear refusal."""
    if version is None:
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError as e:
            raise SGLangPluginError("detent_rl's SGLang plugin needs the sglang package, which is not "
                                    "installed") from e
    if version not in SUPPORTED_VERSIONS:
        raise SGLangPluginError(
            f"detent_rl's SGLang plugin supports sglang {', '.join(SUPPORTED_VERSIONS)}; this is sglang "
            f"{version}. Its hooks patch SGLang's internals, checked against those versions only: install "
            f"a supported one, or load SGLang without the plugin (SGLANG_PLUGINS naming others).")
    return version


def _tuple(commitment: Optional[os.PathLike | str]) -> tuple[Optional[str], Optional[CommitmentTuple]]:
    """(path, the commitment tuple), or (None, None) without one; `commitment` defaults to $DETENT_COMMITMENT."""
    path = commitment if commitment is not None else os.environ.get(ENV_COMMITMENT)
    if not path:
        return None, None
    try:
        return path, CommitmentTuple.load(path)
    except CommitmentError as e:
        raise SGLangPluginError(str(e)) from e


def split_tile_size(commitment: Optional[os.PathLike | str] = None) -> int:
    """The Triton decode split tile the tuple commits (site SITE, knob `split_tile_size`), or the
    program's default without a tuple. `commitment` defaults to $DETENT_COMMITMENT."""
    return _split_tile(*_tuple(commitment))


def _split_tile(path: Optional[str], tuple_: Optional[CommitmentTuple]) -> int:
    default = TD.DEFAULT_SPLIT_TILE
    site = tuple_.sites.get(SITE) if tuple_ is not None else None
    if site is None:
        return default
    tile = site.knobs.get("split_tile_size", default)
    if tile not in TD.SPLIT_TILE_CHOICES:
        raise SGLangPluginError(f"{path}: sites.{SITE}.knobs.split_tile_size is {tile!r}; the Triton decode "
                                f"split tile is one of {TD.SPLIT_TILE_CHOICES}")
    return tile


def backend_facts(backend: Any) -> dict:
    """The selection program's deployment facts of a TritonAttnBackend, on the pinned (deterministic) path."""
    return {"num_head": backend.num_head, "num_kv_head": backend.num_kv_head, "num_group": 1,
            "max_context_len": backend.max_context_len, "device_core_count": backend.device_core_count,
            "max_num_seq": MAX_NUM_SEQ, "triton_attention_num_kv_splits": backend.max_kv_splits,
            "triton_attention_split_tile_size": 0, "use_mla": bool(backend.use_mla), "platform": "cuda",
            "static_kv_splits_env": False, "enable_deterministic": True}


def backend_selector(facts: dict, tile: int):
    """The committed selector of the Triton decode program for these facts and split tile."""
    sol = solve(TD.triton_decode_num_kv_splits, facts)
    if sol.stats["pins"]:  # the pinned path reads only the request's own length: nothing to pin
        raise SGLangPluginError(f"the Triton decode selection still reads the batch at {sol.stats['pins']} "
                                f"on its fixed-tile path for {facts}")
    return sol.commit(knobs={"split_tile_size": tile})


_STATE: dict = {"registered": False, "model_hooks": False, "tile": None, "moe_pins": None, "moe_path": None,
                "ar_pins": None}


def register(commitment: Optional[os.PathLike | str] = None) -> None:
    """Register every hook with SGLang's HookRegistry (the `sglang.srt.plugins` entry point; idempotent).
    SGLang's `load_plugins()` applies them; a caller outside it runs `HookRegistry.apply_hooks()`."""
    version = check_version()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    path, tuple_ = _tuple(commitment)
    _STATE["tile"] = _split_tile(path, tuple_)
    site = tuple_.sites.get(MOE_SITE) if tuple_ is not None else None
    _STATE["moe_pins"], _STATE["moe_path"] = (dict(site.pins) if site is not None else None), path  # the tuple's path
    moe_token_count.cache_clear()
    moe_facts.cache_clear()
    site = tuple_.sites.get(AR_SITE) if tuple_ is not None else None
    _STATE["ar_pins"] = dict(site.pins) if site is not None else None
    from detent_rl.rollout import sglang_model as M
    if M.configure(path, tuple_) and not _STATE["model_hooks"]:  # the model's kernels: a tuple with a deployment
        M.register(HookRegistry, HookType, version)
        _STATE["model_hooks"] = True
    if _STATE["registered"]:
        return
    HookRegistry.register(f"{TRITON_BACKEND}.__init__", pin_backend, HookType.AFTER)
    HookRegistry.register(f"{FA3_BACKEND}.__init__", pin_fa3_backend, HookType.AFTER)
    HookRegistry.register(f"{FLASHINFER_BACKEND}.__init__", pin_flashinfer_backend, HookType.AROUND)
    HookRegistry.register(f"{TRITON_BACKEND}.get_num_kv_splits", pinned_num_kv_splits, HookType.REPLACE)
    moe = pinned_moe_config if version in TRANSCRIBED_FOR["fused_moe"] else untranscribed_moe_config
    HookRegistry.register(MOE_CONFIG, moe, HookType.AROUND)
    HookRegistry.register(f"{SAMPLING_PARAMS}.verify", require_seed, HookType.AFTER)
    HookRegistry.register(f"{SAMPLING_BATCH}.from_schedule_batch", seeded_batch, HookType.AFTER)
    from detent_rl.rollout import sglang_allreduce as A  # its hooks read this module's constants and state
    if version in TRANSCRIBED_FOR["allreduce"]:
        HookRegistry.register(f"{ALLREDUCE}.__init__", A.pin_allreduce, HookType.AFTER)
        HookRegistry.register(f"{ALLREDUCE}._pick_config", A.pinned_pick_config, HookType.REPLACE)
        HookRegistry.register(f"{ALLREDUCE}.should_custom_ar", A.pinned_should_custom_ar, HookType.REPLACE)
        HookRegistry.register(f"{GROUP}.all_reduce", A.require_pinned_allreduce, HookType.BEFORE)
    else:
        HookRegistry.register(f"{GROUP}.all_reduce", A.refuse_untranscribed_allreduce, HookType.BEFORE)
    _STATE["registered"] = True


def applied() -> bool:
    """Whether SGLang's Triton backend now runs the plugin's split count (HookRegistry logs a failed
    patch instead of raising: a caller that relies on the pins checks this)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    cells = getattr(TritonAttnBackend.get_num_kv_splits, "__closure__", None) or ()
    return any(c.cell_contents is pinned_num_kv_splits for c in cells)


def pin_backend(result: Any, backend: Any, *args: Any, **kwargs: Any) -> None:
    """After TritonAttnBackend.__init__: the fixed split tile, and split buffers sized from the selector
    (they are allocated later, from `max_kv_splits`)."""
    tile = _STATE["tile"] or split_tile_size()
    selector = backend_selector(backend_facts(backend), tile)
    longest = backend.max_context_len
    top = selector(seq_len=longest, max_seq_len=longest, min_seq_len=1, num_seq=1)
    backend.split_tile_size = tile
    backend.max_kv_splits = top.max_kv_splits
    backend.static_kv_splits = False
    # SGLang's Lean decode (ROCm): a persistent grid whose programs steal KV tiles, so a row's partial
    # sums follow the batch; its deterministic mode turns it off the same way
    backend.enable_lean_attention = False
    # the backend's own deterministic paths: the unified one-stage extend kernel (the two-stage one walks
    # the cached prefix and the new chunk separately, so chunked prefill moved a prompt row's bits:
    # tests/test_sglang_plugin.py) and window alignment; its split count is this plugin's (the
    # get_num_kv_splits hook), and SGLang's process-wide deterministic mode (its seed 42, its
    # batch-invariant ops) stays off
    backend.enable_deterministic = True
    backend.detent_selector = selector


def pin_fa3_backend(result: Any, backend: Any, *args: Any, **kwargs: Any) -> None:
    """After FlashAttentionBackend.__init__: one KV split, in prefill and decode. FA3 splits a row's keys
    into `num_splits` equal parts of its KV length (0: its heuristic picks the count from the batch), so
    no count but one keeps a row's bits when the batch or its length moves: SGLang's deterministic
    setting, here without the rest of that mode (both fields are read at forward time, after __init__).
    (No split stride exists in FA3 to keep split-KV's speed; the Triton backend has one, and only its
    rollout has a trainer-side reproduction so far.) The same class runs FA4, whose deterministic mode
    also switches its kernels to batch-invariant ones before their first compile: refused here."""
    version = getattr(backend, "fa_impl_ver", 3)
    if version != 3:
        raise SGLangPluginError(f"detent_rl's SGLang plugin pins FlashAttention 3's splits; this backend runs "
                                f"FlashAttention {version}, whose batch invariance it does not set up: use "
                                f"--attention-backend triton (or fa3)")
    for field in FA3_SPLIT_FIELDS[check_version()]:
        setattr(backend, field, 1)


def pin_flashinfer_backend(original: Any, backend: Any, model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """Around FlashInferAttnBackend.__init__: SGLang's deterministic flag in force while it runs (the
    scoped override of SGLang's runtime context), and its prefill and decode split tiles set to the
    model's context length, so the backend it builds takes SGLang's deterministic path with one split
    (module docstring). The variables and the flag are put back after."""
    from unittest import mock

    from sglang.srt.runtime_context import get_exec
    tile = str(max(1, int(model_runner.model_config.context_len)))
    with mock.patch.dict(os.environ, {name: tile for name in FLASHINFER_TILES}), \
            get_exec().deterministic.override(enable_deterministic_inference=True):
        original(backend, model_runner, *args, **kwargs)


def pinned_num_kv_splits(backend: Any, num_kv_splits: torch.Tensor, seq_lens: torch.Tensor,
                         uneven_batch: Optional[torch.Tensor] = None) -> None:
    """TritonAttnBackend.get_num_kv_splits, pinned: each request's split count is ceil(its own KV length
    / the split tile) — the committed selector's value, computed for the whole batch on the device (no
    host round trip; CUDA graphs capture it). `uneven_batch` only reorders work on HIP."""
    num_group = num_kv_splits.shape[0] // seq_lens.shape[0]
    if num_group * seq_lens.shape[0] != num_kv_splits.shape[0]:
        raise ValueError(f"{num_kv_splits.shape[0]} split slots for {seq_lens.shape[0]} sequences")
    lens = seq_lens.repeat_interleave(num_group) if num_group > 1 else seq_lens
    num_kv_splits[:] = split_counts(lens, backend.split_tile_size)


def split_counts(seq_lens: torch.Tensor, tile: int) -> torch.Tensor:
    """The pinned split count of each KV length: ceil(length / tile) (the trainer's reproduction,
    `rollout/sglang_attention.py`, takes the same)."""
    return (seq_lens + tile - 1) // tile


@functools.lru_cache(maxsize=None)
def moe_facts(w2_shape: tuple, dtype: Optional[str], is_marlin: bool, block_shape: Optional[tuple],
              per_channel_quant: bool) -> tuple:
    """The fused-MoE program's facts (sorted items) for one call of SGLang's try_get_optimal_moe_config,
    read from SGLang itself (device name, deterministic flag, shared-memory probe, shipped config files);
    cached: a process serves one device and one SGLang configuration."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F
    import triton
    E, _, N = w2_shape
    block_n, block_k = (block_shape[0], block_shape[1]) if block_shape else (0, 0)
    name = F.get_config_file_name(E, N, dtype, [block_n, block_k], per_channel_quant)
    root = os.path.join(os.environ.get("SGLANG_MOE_CONFIG_DIR", os.path.dirname(os.path.realpath(F.__file__))),
                        "configs")
    shipped = os.path.isdir(root) and any(os.path.exists(os.path.join(root, d, name)) for d in os.listdir(root)
                                          if d.startswith("triton_"))
    facts = {"device_name": F.get_device_name().replace(" ", "_"), "E": E, "N": N, "dtype": dtype or "",
             "block_n": block_n, "block_k": block_k, "per_channel_quant": bool(per_channel_quant),
             "is_marlin": bool(is_marlin), "triton_version": triton.__version__, "tuned_config_shipped": shipped,
             "deterministic": bool(F.get_exec().deterministic.enable_deterministic_inference),
             "low_smem_fp8": bool(F._use_low_smem_fp8_default()), "is_hip": bool(F._is_hip), "support_tma": True,
             "max_num_tokens": MOE_MAX_TOKENS}
    return tuple(sorted(facts.items()))


@functools.lru_cache(maxsize=None)
def moe_token_count(facts_items: tuple) -> int:
    """A token count whose stock MoE selection is the committed one (the tuple's pins at MOE_SITE or the
    solver's default) for these facts: the pin itself where it is a table row, else the first M that
    lands on the pinned branch."""
    facts = dict(facts_items)
    try:
        sol = solve(MOE.fused_moe_config, facts)
        committed = sol.commit(_STATE["moe_pins"])
    except (SelIRError, SelectionError) as e:
        where = f"{_STATE['moe_path']}: sites.{MOE_SITE}: " if _STATE["moe_pins"] is not None else ""
        raise SGLangPluginError(f"{where}the fused-MoE selection for {facts}: {e}") from e
    want = committed.as_dict(committed(M=1))
    candidates = [v for v in committed.pins.values() if isinstance(v, int) and not isinstance(v, bool)]
    candidates += [1, facts["E"], facts["E"] + 1, *range(2, MOE_MAX_TOKENS + 1, 61)]
    for m in candidates:
        if 1 <= m <= MOE_MAX_TOKENS and MOE.fused_moe_config(M=m, **facts) == want:
            return m
    raise SGLangPluginError(f"no token count gives the committed fused-MoE selection {want} for {facts}")


def pinned_moe_config(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Around SGLang's try_get_optimal_moe_config: the call as made, with M replaced by a token count
    whose selection is the committed one (the same for every M)."""
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    block = tuple(a["block_shape"]) if a["block_shape"] else None
    a["M"] = moe_token_count(moe_facts(tuple(a["w2_shape"]), a["dtype"], a["is_marlin"], block,
                                       a["per_channel_quant"]))
    return original(*bound.args, **bound.kwargs)


def untranscribed_moe_config(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Around try_get_optimal_moe_config on an SGLang whose MoE config choice was not transcribed: refused,
    before the fused-MoE kernel runs (its config row would follow the batch's token count)."""
    raise SGLangPluginError(
        f"detent_rl's SGLang plugin pins the fused-MoE config row on sglang {', '.join(TRANSCRIBED_FOR['fused_moe'])} "
        f"only (its tables and look-up are transcribed from those); this is sglang {check_version()}: serve dense "
        f"models on it, or a MoE model on a release named there")


def require_seed(result: Any, params: Any, *args: Any, **kwargs: Any) -> None:
    """After SamplingParams.verify: a request without `sampling_seed` is refused, and so is min-p
    sampling, which SGLang's seeded sampler does not implement (it asserts)."""
    if params.sampling_seed is None:
        raise ValueError("detent_rl's SGLang plugin samples with request-bound seeds: set `sampling_seed` on "
                         "every request (SGLang would otherwise seed them all with 42, or not at all)")
    if params.min_p > 0:
        raise ValueError(f"min_p is {params.min_p}: SGLang's seeded sampler has no min-p filter, so detent_rl's "
                         f"SGLang plugin refuses it (use top_p / top_k)")


def seeded_batch(info: Any, cls: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """After SamplingBatchInfo.from_schedule_batch: the batch's seeds, each request's own, so SGLang's
    sampler takes its seeded path (`multinomial_with_seed`) whatever its deterministic-mode flag."""
    seeds = [r.sampling_params.sampling_seed for r in batch.reqs]
    missing = [r.rid for r, s in zip(batch.reqs, seeds) if s is None]
    if missing:
        raise ValueError(f"requests {missing[:4]} reached sampling without `sampling_seed` (detent_rl's SGLang "
                         f"plugin refuses them at validation; was it loaded in the tokenizer process?)")
    info.sampling_seed = torch.tensor(seeds, dtype=torch.int64).to(info.device, non_blocking=True)
    return info

