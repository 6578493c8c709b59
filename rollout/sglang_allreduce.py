"""The SGLang plugin's tensor-parallel all-reduce pin (registered by `sglang_plugin.register`).

SGLang sums a TP group's partial activations with its custom all-reduce v2, whose algorithm (one- or
two-shot, push or pull, multicast) `_pick_config` reads from the message size: the batch's token
count. Each algorithm adds a row's rank contributions in its own order, so from three ranks up a
token's bits follow the batch; above the workspace SGLang falls back to NCCL, whose own algorithm and
chunking follow the size too. The plugin commits one plan of the transcribed program
(`custom_allreduce_v2`) for the group's facts, runs every message through it, and refuses what it
cannot hold (a message over the workspace, an unaligned or strided one, another communicator taking
the call) before any kernel runs.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from detent_rl.kernels.programs.sglang import custom_allreduce_v2 as AR
from detent_rl.rollout.sglang_plugin import (_STATE, AR_GRANULE, AR_SITE, TRANSCRIBED_FOR, SGLangPluginError,
                                             check_version)
from detent_rl.selir.errors import SelectionError, SelIRError
from detent_rl.selir.solver import solve


def allreduce_facts(comm: Any, capability: tuple[int, int], max_size: int) -> dict:
    """The all-reduce program's facts of a constructed CustomAllReduceV2 (SGLang's module settings; the
    messages it may see are whole granules up to its largest workspace)."""
    from sglang.srt.distributed.device_communicators import custom_all_reduce_v2 as M
    force_pull, force_push = M._FORCE_PULL_SIZE_KB, M._FORCE_PUSH_SIZE_KB
    return {"world_size": comm.world_size, "cc_major": capability[0], "cc_minor": capability[1],
            "has_multicast": bool(getattr(comm, "has_multicast", False)), "max_size": max_size,
            "force_pull_size_kb": -1 if force_pull is None else int(force_pull),
            "force_push_size_kb": -1 if force_push is None else int(force_push),
            "graph_mode_supported": bool(comm._is_graph_mode_supported), "override_algo": "",
            "max_nbytes": comm.max_size, "granule": AR_GRANULE}


def allreduce_selector(facts: dict, pins: Optional[dict] = None, source: Optional[str] = None):
    """The committed all-reduce selector for these facts: the tuple's `plan` when it gives one, else the
    plan SGLang itself takes for the largest message (the throughput case) when that one is legal for
    every message, else the first legal custom plan. NCCL (plan 0) is refused from three ranks up: its
    algorithm and chunking follow the message size."""
    where = f"{source}: sites.{AR_SITE}: " if pins is not None else ""
    try:
        sol = solve(AR.custom_allreduce_v2, facts)
    except (SelIRError, SelectionError) as e:
        raise SGLangPluginError(f"{where}the all-reduce selection for {facts}: {e}") from e
    legal = [dict(zip(sol.stats["pins"], row)) for row in sol.legal]
    if pins is None:
        largest = AR.custom_allreduce_v2(nbytes=facts["max_nbytes"] // AR_GRANULE * AR_GRANULE,
                                         can_use_graph=False, **facts)
        custom = [p for p in legal if p.get("plan", 0) != 0]
        stock = [p for p in custom if AR.PLANS[p["plan"]].algorithm == largest["algorithm"]]
        pins = (stock or custom or legal or [{}])[0]
    if pins.get("plan") == 0 and facts["world_size"] > 2:
        raise SGLangPluginError(
            f"{where}no custom all-reduce plan holds every message up to {facts['max_nbytes']} bytes on "
            f"{facts['world_size']} ranks (legal plans {[p.get('plan') for p in legal]}), and NCCL's reduction "
            f"order follows the message size: enlarge the workspaces (SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PULL_SIZE_KB "
            f"/ _PUSH_SIZE_KB) or pin a custom plan")
    try:
        return sol.commit(pins)
    except (SelIRError, SelectionError) as e:
        raise SGLangPluginError(f"{where}{e}") from e


def pin_allreduce(result: Any, comm: Any, *args: Any, **kwargs: Any) -> None:
    """After CustomAllReduceV2.__init__: the group's committed plan (its selector on the instance).
    SGLang swallows a constructor's exception (custom all-reduce then just stays off), so a deployment
    the plugin cannot describe is marked here and refused at its first all-reduce."""
    if comm.disabled:
        return
    explicit = sorted(k for k in ("max_pull_size", "max_push_size", "max_pull_blocks", "max_push_blocks")
                      if kwargs.get(k) is not None)
    if explicit:
        comm.detent_refusal = (f"a custom all-reduce built with explicit {', '.join(explicit)} (not a TP "
                               f"group's): the transcribed selection describes the default workspaces only")
        return
    from sglang.srt.distributed.device_communicators import custom_all_reduce_v2 as M
    max_size = kwargs.get("max_size", args[2] if len(args) > 2 else M._DEFAULT_MAX_SIZE)
    facts = allreduce_facts(comm, tuple(torch.cuda.get_device_capability(comm.device)), max_size)
    try:
        comm.detent_selector = allreduce_selector(facts, _STATE["ar_pins"], _STATE["moe_path"])
    except SGLangPluginError as e:
        comm.detent_refusal = str(e)


def _algo(name: str) -> Any:
    from sglang.kernels.ops.communication.all_reduce import AllReduceAlgo
    return next(a for a in AllReduceAlgo if a.algo_name == name)


def _pinned(comm: Any):
    """The instance's committed selector, or the refusal that stands in for it."""
    refusal = getattr(comm, "detent_refusal", None)
    if refusal is not None:
        raise SGLangPluginError(f"detent_rl's SGLang plugin cannot pin this all-reduce: {refusal}")
    selector = getattr(comm, "detent_selector", None)
    if selector is None:
        raise SGLangPluginError("a custom all-reduce without the plugin's pin (built before its hooks were "
                                "applied: load the plugin before SGLang builds its groups)")
    return selector


def pinned_pick_config(comm: Any, nbytes: int, can_use_graph: bool) -> Any:
    """CustomAllReduceV2._pick_config, pinned: the committed plan for every size (its selector raises,
    before any kernel, for a message outside what the plan was legal for)."""
    from sglang.srt.distributed.device_communicators.custom_all_reduce_v2 import AllReduceConfig
    plan = _pinned(comm)(nbytes=nbytes, can_use_graph=bool(can_use_graph))
    if plan.algorithm == "nccl":
        return None
    return AllReduceConfig(_algo(plan.algorithm), use_graph=plan.use_graph, use_multicast=plan.use_multicast)


def pinned_should_custom_ar(comm: Any, inp: torch.Tensor) -> bool:
    """CustomAllReduceV2.should_custom_ar, pinned: yes, or a refusal. Stock SGLang quietly hands an
    unaligned, strided or oversized message to the next communicator (NCCL), another reduction order."""
    from sglang.srt.distributed.device_communicators.custom_all_reduce_v2 import is_weak_contiguous
    if comm.disabled:
        return False
    selector = _pinned(comm)
    nbytes = inp.numel() * inp.element_size()
    if comm.override_algo is not None:
        raise SGLangPluginError(f"an override all-reduce algorithm ({comm.override_algo.algo_name}) replaces the "
                                f"pinned plan")
    if nbytes % AR_GRANULE or not is_weak_contiguous(inp):
        raise SGLangPluginError(f"an all-reduce of {tuple(inp.shape)} {inp.dtype} ({nbytes} bytes, strides "
                                f"{inp.stride()}) is not whole contiguous {AR_GRANULE}-byte granules: SGLang would "
                                f"send it to NCCL, whose reduction order differs from the pinned plan's")
    plan = selector(nbytes=nbytes, can_use_graph=bool(comm._can_use_graph()))  # raises outside the plan
    return plan.algorithm != "nccl"


def require_pinned_allreduce(group: Any, input_: torch.Tensor) -> None:
    """Before GroupCoordinator.all_reduce of a device tensor on more than one rank: the call must reach the
    pinned custom all-reduce. SGLang tries mscclpp and FlashInfer's fused all-reduce before it and NCCL
    (or symmetric-memory NCCL) when it is off; each sums in its own order."""
    if group.world_size == 1 or input_.is_cpu:
        return
    ca = group.ca_comm
    if ca is None or ca.disabled:
        raise SGLangPluginError(
            f"group {group.unique_name}: an all-reduce over {group.world_size} ranks without SGLang's custom "
            f"all-reduce v2 (--disable-custom-all-reduce, SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=0, a group it "
            f"does not support, or its setup failed: see SGLang's warning); detent_rl's plugin pins only that "
            f"communicator's plan")
    _pinned(ca)
    if group.pymscclpp_comm is not None:
        raise SGLangPluginError(f"group {group.unique_name}: mscclpp all-reduce is on (--enable-mscclpp); it "
                                f"runs before the pinned custom all-reduce")
    if getattr(group, "_fi_workspace_hint", None) is not None:
        raise SGLangPluginError(f"group {group.unique_name}: FlashInfer's fused all-reduce is on "
                                f"(--enable-flashinfer-allreduce-fusion); it runs before the pinned custom "
                                f"all-reduce")


def refuse_untranscribed_allreduce(group: Any, input_: torch.Tensor) -> None:
    """Before GroupCoordinator.all_reduce on an SGLang whose all-reduce choice was not transcribed (0.5.17's
    custom all-reduce picks among its algorithms in `_pick_algo`, not the `_pick_config` transcribed from
    0.5.23): a device all-reduce over more than one rank is refused before it runs. One rank passes."""
    if group.world_size == 1 or input_.is_cpu:
        return
    raise SGLangPluginError(
        f"group {group.unique_name}: an all-reduce over {group.world_size} ranks on sglang {check_version()}; "
        f"detent_rl's SGLang plugin pins the tensor-parallel all-reduce on sglang "
        f"{', '.join(TRANSCRIBED_FOR['allreduce'])} only (its algorithm choice is transcribed from those): "
        f"run tensor parallelism 1 here, or a release named there")
