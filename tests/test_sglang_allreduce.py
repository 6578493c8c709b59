"""The SGLang plugin's tensor-parallel all-reduce pin, against SGLang 0.5.23's own CustomAllReduceV2 on
the CPU (skipped without SGLang; .ci/run installs it, see tests/sglang_env.py).

The communicator is built by SGLang's own constructor (its tuned tables, clipping, workspace sizing),
with what needs GPUs replaced: the group's rank and size, the device's compute capability, and
`_init_workspace`, reduced to its one dispatch effect (no multicast plane: `num_mc_blocks = None`).
Messages then go through SGLang's own `should_custom_ar` and `custom_all_reduce`, with the kernel
launch replaced by a recorder of the algorithm it was handed. Which algorithm runs is all this shows;
the kernels' bits need a multi-GPU machine."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_env import import_sglang, plugin_reset, skip_unless_transcribed

sglang = import_sglang()
skip_unless_transcribed("allreduce")

from sglang.srt.distributed.device_communicators import custom_all_reduce_v2 as M  # noqa: E402
from sglang.srt.distributed.device_communicators.configs import custom_all_reduce_v2 as MC  # noqa: E402
from sglang.srt.distributed.parallel_state import GroupCoordinator  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from detent_rl.kernels.commitment import CommitmentTuple  # noqa: E402
from detent_rl.rollout import sglang_allreduce as A  # noqa: E402
from detent_rl.rollout import sglang_plugin as P  # noqa: E402
from detent_rl.selir.errors import SelectionError  # noqa: E402

RESET = plugin_reset()
HIDDEN = 4096  # a bf16 hidden row: 8 KiB, whole 16-byte granules
TOKENS = (1, 4, 16, 64, 256, 1024)  # the batch's token count: the message grows with it


@pytest.fixture
def sglang_ar(monkeypatch):
    """build(world_size, capability, multicast, pinned, commitment) -> SGLang's CustomAllReduceV2 on this
    CPU, and the list its kernel launches are recorded into."""
    calls: list = []
    built: list = []

    def build(world_size=8, capability=(9, 0), multicast=True, pinned=True, commitment=None, **kwargs):
        RESET()
        if pinned:
            P.register(commitment)
            HookRegistry.apply_hooks()
        MC._get_all_reduce_configs.cache_clear()
        MC.get_all_reduce_config.cache_clear()
        monkeypatch.setattr(M, "can_use_custom_all_reduce_v2", lambda **kw: True)
        monkeypatch.setattr(M.dist, "get_rank", lambda group=None: 0)
        monkeypatch.setattr(M.dist, "get_world_size", lambda group=None: world_size)
        monkeypatch.setattr(M, "in_the_same_node_as", lambda group, source_rank=0: [True] * world_size)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device=None: SimpleNamespace(multi_processor_count=132))
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)  # read only in capture()

        def workspace(self):  # _init_workspace's one effect on dispatch: multicast off without its plane
            self.has_multicast = multicast
            if not multicast or not self.pull_enabled:
                self.config = self.config._replace(num_mc_blocks=None)
            self.obj = "communicator"
        monkeypatch.setattr(M.CustomAllReduceV2, "_init_workspace", workspace)
        monkeypatch.setattr(M, "IPCManager", lambda: None)
        monkeypatch.setattr(M, "VmmGraphInputManager", lambda **kw: SimpleNamespace(close=lambda: None))
        monkeypatch.setattr(M, "custom_all_reduce", lambda obj, inp, algo, graph_params, use_multicast:
                            calls.append((algo.algo_name, use_multicast)) or inp)
        monkeypatch.setattr(M, "get_all_reduce_module", lambda dtype, ws: SimpleNamespace(
            all_reduce=lambda obj, inp, name, _, mc: calls.append((name, mc)) or inp))
        comm = M.CustomAllReduceV2(group=None, device=torch.device("cpu"), **kwargs)
        built.append(comm)
        calls.clear()
        return comm

    yield build, calls
    for comm in built:  # nothing to tear down: SGLang's close() would free IPC handles and barrier
        comm.__dict__.pop("obj", None)
    RESET()
    MC._get_all_reduce_configs.cache_clear()
    MC.get_all_reduce_config.cache_clear()


def dispatch(comm, x: torch.Tensor, graph: bool, calls: list) -> tuple:
    """One all-reduce as GroupCoordinator routes it to the custom communicator: its should_custom_ar, then
    custom_all_reduce (eager, or inside a CUDA graph capture); 'nccl' when SGLang passes the message on."""
    comm._graph_mode_allowed = graph
    if not comm.should_custom_ar(x):
        return ("nccl", False)
    comm.custom_all_reduce(x)
    return calls.pop()


def algorithms(comm, calls, graph: bool, tokens=TOKENS) -> list:
    return [dispatch(comm, torch.zeros(t, HIDDEN, dtype=torch.bfloat16), graph, calls) for t in tokens]


@pytest.mark.parametrize("world_size,multicast", [(8, True), (8, False), (4, True), (3, False)])
def test_the_pinned_plan_runs_for_every_batch_where_sglang_switches(sglang_ar, world_size, multicast):
    build, calls = sglang_ar
    stock = build(world_size, multicast=multicast, pinned=False)
    for graph in (False, True):  # negative control: SGLang's own choice follows the token count
        assert len(set(algorithms(stock, calls, graph))) > 1, (world_size, multicast, graph)
    comm = build(world_size, multicast=multicast)
    want = comm.detent_selector.pins["plan"]
    assert want != 0  # a custom plan: NCCL's order follows the message size
    plan = A.AR.PLANS[want]
    for graph in (False, True):
        assert set(algorithms(comm, calls, graph)) == {(plan.algorithm, plan.use_multicast)}, graph


def test_a_message_the_plan_cannot_hold_stops_before_any_kernel(sglang_ar):
    build, calls = sglang_ar
    stock = build(8, pinned=False)
    big = torch.zeros(stock.max_size // (2 * HIDDEN) + 1, HIDDEN, dtype=torch.bfloat16)
    odd = torch.zeros(3, 1001, dtype=torch.bfloat16)  # 6,006 bytes: not whole granules
    strided = torch.zeros(8, 2 * HIDDEN, dtype=torch.bfloat16)[:, :HIDDEN]
    for x in (big, odd, strided):  # stock SGLang quietly passes each of them to NCCL
        assert dispatch(stock, x, False, calls) == ("nccl", False)
    comm = build(8)
    with pytest.raises(SelectionError):
        dispatch(comm, big, False, calls)
    for x in (odd, strided):
        with pytest.raises(P.SGLangPluginError, match="granules"):
            dispatch(comm, x, False, calls)
    assert calls == []


def test_the_plan_comes_from_the_commitment_tuple(sglang_ar, tmp_path):
    build, calls = sglang_ar
    default = build(8, multicast=False).detent_selector.pins["plan"]
    other = next(p for p in (3, 6) if p != default)  # 1shot_pull / 2shot_pull: both legal here
    path = CommitmentTuple({P.AR_SITE: {"pins": {"plan": other}}}).save(tmp_path / "t.json")
    comm = build(8, multicast=False, commitment=path)
    assert set(algorithms(comm, calls, False)) == {(A.AR.PLANS[other].algorithm, False)}
    # 1shot_push: the push slots cannot hold the largest messages; NCCL: refused from three ranks up
    for plan, why in ((1, "plan"), (0, "NCCL's reduction order")):
        bad = CommitmentTuple({P.AR_SITE: {"pins": {"plan": plan}}}).save(tmp_path / f"bad{plan}.json")
        comm = build(8, multicast=False, commitment=bad)
        with pytest.raises(P.SGLangPluginError, match=rf"bad{plan}\.json: sites\.sglang\.custom_allreduce: .*{why}"):
            dispatch(comm, torch.zeros(1, HIDDEN, dtype=torch.bfloat16), False, calls)
    assert calls == []


def test_an_instance_with_explicit_workspaces_is_refused_at_first_use(sglang_ar):
    build, calls = sglang_ar
    comm = build(8, max_pull_size=0)  # SGLang's push-only instances (fused qk-norm)
    with pytest.raises(P.SGLangPluginError, match="explicit max_pull_size"):
        dispatch(comm, torch.zeros(1, HIDDEN, dtype=torch.bfloat16), False, calls)


def test_the_group_refuses_an_all_reduce_that_would_skip_the_pin(sglang_ar):
    build, calls = sglang_ar
    comm = build(4)
    x = torch.empty(8, HIDDEN, dtype=torch.bfloat16, device="meta")  # a device tensor (not the CPU path)
    group = SimpleNamespace(world_size=4, unique_name="tp:0", ca_comm=None, pymscclpp_comm=None,
                            _fi_workspace_hint=None)
    with pytest.raises(P.SGLangPluginError, match="without SGLang's custom all-reduce v2"):
        GroupCoordinator.all_reduce(group, x)  # SGLang's method, the plugin's check in front of it
    group.ca_comm, group.pymscclpp_comm = comm, object()
    with pytest.raises(P.SGLangPluginError, match="mscclpp"):
        GroupCoordinator.all_reduce(group, x)
    group.pymscclpp_comm, group._fi_workspace_hint = None, "tp"
    with pytest.raises(P.SGLangPluginError, match="FlashInfer"):
        GroupCoordinator.all_reduce(group, x)
    group._fi_workspace_hint = None
    A.require_pinned_allreduce(group, x)  # the pinned communicator takes it
    assert A.require_pinned_allreduce(SimpleNamespace(world_size=1), x) is None
