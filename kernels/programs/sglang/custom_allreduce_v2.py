"""SGLang 0.5.23, custom all-reduce v2: which algorithm an all-reduce of `nbytes` runs (SelIR transcription).

Transcribes, from the `sglang==0.5.23` wheel (`srt/distributed/device_communicators/`):
  * `configs/custom_all_reduce_v2.py`: the raw `_sm100_configs` (141-203), `_sm107_configs`
    (207-261), `_sm90_configs` (265-312) and default (`_get_all_reduce_configs`, 315-333) tables,
    `Heuristic.max_push_bytes`, `max_pull_bytes`, `clip`, `two_shot_push_slot_bytes`,
    `two_shot_push_max_bytes` (17-131);
  * `custom_all_reduce_v2.py`: `CustomAllReduceV2.__init__` workspace sizing and clipping (110-224:
    `max_size` cap, forced sizes, 1 KiB alignment, pull plane on/off), multicast turned off without
    a multicast pointer (`_init_workspace`, 265-~360), `_pick_config` (385-399), `should_custom_ar`
    (401-415) and the override path of `custom_all_reduce` (456-484).

The clipped thresholds are computed here from the raw tables and the `max_size` fact (default 16 MiB,
`SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB`), as the constructor does. `can_use_graph` is
`_can_use_graph()`: true only while a CUDA graph is being captured; eager calls (and warm-up runs
inside `capture()`) pick with the eager heuristic. "nccl" stands for `should_custom_ar` being False
(the caller then tries other communicators and falls back to NCCL). The facts describe a group that
`dispatch_custom_allreduce` / `can_use_custom_all_reduce_v2` admitted (CUDA, full NVLink, a supported
world size). Not modelled: the weak-contiguity check (an input property) and the block counts (grid
sizes, not the algorithm; so `num_sms` is no fact here).

The decision is one plan id (a row of PLANS), so the three selection points share one value.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Runtime, Unpinnable, assume, record, require, selection

KB, MB = 1024, 1024 * 1024
ALIGN_BYTES = 1024


@record
class Heuristic:
    one_shot_push: int
    one_shot_pull: int
    two_shot_pull: int
    mc_min: int
    mc_max: int
    two_shot_push: int  # 0: 2shot_push disabled


@record
class ArConfig:
    graph: Heuristic
    eager: Heuristic
    has_mc_blocks: bool  # num_mc_blocks is not None


@record
class Plan:
    algorithm: str
    use_graph: bool
    use_multicast: bool


def _h(push1: float, pull1: float, pull2: float, mc: tuple = (0, 0), push2: int = 0) -> Heuristic:
    """A table row as `_pack_heuristic` builds it: float sizes truncated with int()."""
    return Heuristic(one_shot_push=int(push1), one_shot_pull=int(pull1), two_shot_pull=int(pull2),
                     mc_min=int(mc[0]), mc_max=int(mc[1]), two_shot_push=push2)


SM90 = {  # tuned on H200; num_mc_blocks = None if ws < 4 else 128 // ws
    2: ArConfig(graph=_h(16 * MB, 128 * MB, 128 * MB), eager=_h(32 * MB, 128 * MB, 128 * MB), has_mc_blocks=False),
    3: ArConfig(graph=_h(1.25 * MB, 1.25 * MB, 128 * MB), eager=_h(3 * MB, 3 * MB, 16 * MB), has_mc_blocks=False),
    4: ArConfig(graph=_h(384 * KB, 384 * KB, 128 * MB), eager=_h(896 * KB, 896 * KB, 32 * MB, (0, 32 * MB)),
                has_mc_blocks=True),
    5: ArConfig(graph=_h(192 * KB, 192 * KB, 32 * MB), eager=_h(384 * KB, 384 * KB, 32 * MB, (0, 32 * MB)),
                has_mc_blocks=True),
    6: ArConfig(graph=_h(128 * KB, 128 * KB, 32 * MB, (8 * MB, 32 * MB)),
                eager=_h(192 * KB, 192 * KB, 32 * MB, (0, 32 * MB)), has_mc_blocks=True),
    7: ArConfig(graph=_h(128 * KB, 128 * KB, 32 * MB, (1 * MB, 32 * MB)),
                eager=_h(128 * KB, 128 * KB, 32 * MB, (0, 32 * MB)), has_mc_blocks=True),
    8: ArConfig(graph=_h(128 * KB, 128 * KB, 32 * MB, (512 * KB, 128 * MB)),
                eager=_h(128 * KB, 128 * KB, 128 * MB, (0, 128 * MB)), has_mc_blocks=True),
}
SM100 = {  # B200/B300/GB200; num_mc_blocks = {5: 64, 6: 48, 7: 48, 8: 32, 16: 32}.get(ws)
    2: ArConfig(graph=_h(8 * MB, 32 * MB, 128 * MB), eager=_h(16 * MB, 128 * MB, 128 * MB), has_mc_blocks=False),
    3: ArConfig(graph=_h(4 * MB, 4 * MB, 128 * MB), eager=_h(8 * MB, 8 * MB, 32 * MB), has_mc_blocks=False),
    4: ArConfig(graph=_h(0.625 * MB, 0.625 * MB, 128 * MB, push2=8 * MB),
                eager=_h(0.625 * MB, 0.625 * MB, 32 * MB, push2=8 * MB), has_mc_blocks=False),
    5: ArConfig(graph=_h(1.5 * MB, 1.5 * MB, 128 * MB), eager=_h(2 * MB, 2 * MB, 32 * MB, (0, 32 * MB)),
                has_mc_blocks=True),
    6: ArConfig(graph=_h(1 * MB, 1 * MB, 128 * MB), eager=_h(1.25 * MB, 1.25 * MB, 64 * MB, (0, 64 * MB)),
                has_mc_blocks=True),
    7: ArConfig(graph=_h(0.625 * MB, 0.625 * MB, 128 * MB), eager=_h(1 * MB, 1 * MB, 64 * MB, (0, 64 * MB)),
                has_mc_blocks=True),
    8: ArConfig(graph=_h(256 * KB, 256 * KB, 128 * MB, (8 * MB, 128 * MB), 8 * MB),
                eager=_h(256 * KB, 256 * KB, 128 * MB, (0, 128 * MB), 8 * MB), has_mc_blocks=True),
    16: ArConfig(graph=_h(0.25 * MB, 0.25 * MB, 128 * MB, (256 * KB, 128 * MB)),
                 eager=_h(0.25 * MB, 0.25 * MB, 128 * MB, (256 * KB, 128 * MB)), has_mc_blocks=True),
}
SM107 = {  # Rubin; num_mc_blocks = {4: 128, 5: 128, 6: 128, 7: 128, 8: 96, 16: 32}.get(ws)
    2: ArConfig(graph=_h(128 * MB, 128 * MB, 128 * MB), eager=_h(128 * MB, 128 * MB, 128 * MB), has_mc_blocks=False),
    3: ArConfig(graph=_h(19.625 * MB, 19.625 * MB, 128 * MB), eager=_h(39.188 * MB, 39.188 * MB, 128 * MB),
                has_mc_blocks=False),
    4: ArConfig(graph=_h(6.938 * MB, 6.938 * MB, 128 * MB),
                eager=_h(9.812 * MB, 9.812 * MB, 128 * MB, (9.812 * MB, 128 * MB)), has_mc_blocks=True),
}
for _ws, _t in ((5, 6.938), (6, 4.875), (7, 3.438), (8, 2.438), (16, 832 / 1024)):  # graph == eager rows
    SM107[_ws] = ArConfig(graph=_h(_t * MB, _t * MB, 128 * MB, (_t * MB, 128 * MB)),
                          eager=_h(_t * MB, _t * MB, 128 * MB, (_t * MB, 128 * MB)), has_mc_blocks=True)
DEFAULT = {ws: ArConfig(graph=_h(1 * MB, 1 * MB, 16 * MB), eager=_h(1 * MB, 1 * MB, 16 * MB), has_mc_blocks=False)
           for ws in range(2, 17)}

PLANS = {
    0: Plan(algorithm="nccl", use_graph=False, use_multicast=False),
    1: Plan(algorithm="1shot_push", use_graph=False, use_multicast=False),
    2: Plan(algorithm="2shot_push", use_graph=False, use_multicast=False),
    3: Plan(algorithm="1shot_pull", use_graph=False, use_multicast=False),
    4: Plan(algorithm="1shot_pull", use_graph=True, use_multicast=False),
    5: Plan(algorithm="2shot_pull", use_graph=False, use_multicast=True),
    6: Plan(algorithm="2shot_pull", use_graph=False, use_multicast=False),
    7: Plan(algorithm="2shot_pull", use_graph=True, use_multicast=False),
}
OVERRIDES = ("", "1shot_push", "2shot_push", "1shot_pull", "2shot_pull")


@selection
def push_bytes(h: Fact[Heuristic], ws: Fact[int]):
    """Heuristic.max_push_bytes: a 1shot_push payload, or one 2shot_push slot (32 * ceil(n / 16 ws))."""
    return max(h.one_shot_push, 32 * ((h.two_shot_push + 16 * ws - 1) // (16 * ws)))


@selection
def lift(h: Fact[Heuristic], one_shot_push: Fact[int], two_shot_pull: Fact[int]):
    return Heuristic(one_shot_push=one_shot_push, one_shot_pull=h.one_shot_pull, two_shot_pull=two_shot_pull,
                     mc_min=h.mc_min, mc_max=h.mc_max, two_shot_push=h.two_shot_push)


@selection
def clip(h: Fact[Heuristic], max_push: Fact[int], max_pull: Fact[int], ws: Fact[int]):
    """Heuristic.clip: no threshold may exceed the workspace that serves it."""
    return Heuristic(one_shot_push=min(h.one_shot_push, max_push), one_shot_pull=min(h.one_shot_pull, max_pull),
                     two_shot_pull=min(h.two_shot_pull, max_pull), mc_min=min(h.mc_min, max_pull),
                     mc_max=min(h.mc_max, max_pull),
                     two_shot_push=min(h.two_shot_push, ws * 16 * (max_push // 32)))


@selection
def pick_config(nbytes: Unpinnable[int], can_use_graph: Runtime[bool], graph: Fact[Heuristic],
                eager: Fact[Heuristic], can_use_multicast: Fact[bool]):
    """CustomAllReduceV2._pick_config, as a PLANS id (0: None)."""
    h = graph if can_use_graph else eager
    if nbytes <= h.one_shot_push:
        return 1
    if nbytes <= h.two_shot_push:
        return 2
    if nbytes <= h.one_shot_pull:
        return 4 if can_use_graph else 3
    if can_use_multicast and h.mc_min <= nbytes <= h.mc_max:
        return 5
    if nbytes <= h.two_shot_pull:
        return 7 if can_use_graph else 6
    return 0


@selection
def custom_allreduce_v2(nbytes: Unpinnable[int], can_use_graph: Runtime[bool], world_size: Fact[int],
                        cc_major: Fact[int], cc_minor: Fact[int], has_multicast: Fact[bool], max_size: Fact[int],
                        force_pull_size_kb: Fact[int], force_push_size_kb: Fact[int], graph_mode_supported: Fact[bool],
                        override_algo: Fact[str], max_nbytes: Fact[int], granule: Fact[int]):
    """`nbytes` = numel * element_size of the all-reduce input; force sizes are -1 when unset; every
    message is a whole number of `granule` bytes (1: any size; a deployment whose rows are whole
    16-byte granules, hidden * dtype bytes = 0 mod 16, says 16, as the plugin does)."""
    assume(1 <= nbytes <= max_nbytes)
    assume(nbytes % granule == 0)
    table = SM90 if cc_major == 9 else (SM107 if cc_minor >= 7 else SM100) if cc_major == 10 else DEFAULT
    require(world_size in table, "world size not supported by custom all-reduce v2")
    require(override_algo in OVERRIDES)
    base = table[world_size]
    max_pull = min(max(base.graph.one_shot_pull, base.graph.two_shot_pull, base.graph.mc_max,
                       base.eager.one_shot_pull, base.eager.two_shot_pull, base.eager.mc_max), max_size)
    max_push = min(max(push_bytes(base.graph, world_size), push_bytes(base.eager, world_size)), max_size)
    if force_pull_size_kb >= 0:
        max_pull = force_pull_size_kb * 1024
    if force_push_size_kb >= 0:
        max_push = force_push_size_kb * 1024
    # forced sizes also lift their direction's ceiling (clip() below only lowers thresholds)
    graph = lift(base.graph, max_push if force_push_size_kb >= 0 else base.graph.one_shot_push,
                 max_pull if force_pull_size_kb >= 0 else base.graph.two_shot_pull)
    eager = lift(base.eager, max_push if force_push_size_kb >= 0 else base.eager.one_shot_push,
                 max_pull if force_pull_size_kb >= 0 else base.eager.two_shot_pull)
    pull_enabled = max_pull > 0
    # workspaces are at least 1 KiB and rounded up to 1 KiB; thresholds are clipped to them
    pull_size = (max(max_pull, ALIGN_BYTES) + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES if pull_enabled else 0
    push_size = (max(max_push, ALIGN_BYTES) + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
    graph = clip(graph, push_size, pull_size, world_size)
    eager = clip(eager, push_size, pull_size, world_size)
    can_use_multicast = base.has_mc_blocks and has_multicast and pull_enabled
    graph_now = can_use_graph and graph_mode_supported  # _can_use_graph(): capturing, graph mode allowed
    if override_algo != "":  # should_custom_ar: nbytes <= max_size; pull algos use graph pointers if capturing
        ids = {"1shot_push": 1, "2shot_push": 2, "1shot_pull": 4 if graph_now else 3,
               "2shot_pull": 7 if graph_now else 6}
        chosen = ids[override_algo] if nbytes <= max(pull_size, push_size) else 0
    else:
        chosen = pick_config(nbytes, graph_now, graph, eager, can_use_multicast)
    plan = 0 if nbytes % 16 != 0 else chosen  # should_custom_ar tests the 16-byte granule first
    # What each algorithm needs of the workspace this deployment allocated (checked for pinned plans).
    require(plan == 0 or nbytes % 16 == 0, "custom all-reduce needs a multiple of 16 bytes")
    require(plan != 1 or nbytes <= push_size, "1shot_push payload fits a push slot")
    require(plan != 2 or 32 * ((nbytes + 16 * world_size - 1) // (16 * world_size)) <= push_size,
            "2shot_push chunk fits a push slot")
    require(plan < 3 or (pull_enabled and nbytes <= pull_size), "pull algorithms fit the pull buffer")
    require(plan != 5 or can_use_multicast, "multicast 2shot_pull needs multicast")
    require(not PLANS[plan].use_graph or graph_now, "graph pointers exist only while capturing")
    return PLANS[plan]


# Llama-3.1-70B-like TP8 (hidden 8192, bf16) on 8 H200s (SM 9.0), default 16 MiB cap, NVLS multicast
# available, up to 8192 tokens per all-reduce.
REFERENCE_FACTS = {
    "world_size": 8, "cc_major": 9, "cc_minor": 0, "has_multicast": True, "max_size": 16 * MB,
    "force_pull_size_kb": -1, "force_push_size_kb": -1, "graph_mode_supported": True, "override_algo": "",
    "max_nbytes": 8192 * 8192 * 2, "granule": 1,
}

PROGRAM = custom_allreduce_v2  # the module's main program (for the registry and reports)
