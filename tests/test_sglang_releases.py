"""The SGLang releases the plugin supports (rollout/sglang_plugin.py, SUPPORTED_VERSIONS), against the installed
one on the CPU: another release is refused by name, and on a supported release whose selection code was not
transcribed (TRANSCRIBED_FOR: 0.5.17's fused-MoE config and all-reduce) SGLang's own call is refused before
its kernel runs. .ci/run runs this file against 0.5.23 and 0.5.17 (tests/sglang_env.py)."""
from __future__ import annotations

import importlib.metadata
from types import SimpleNamespace

import pytest
import torch

from sglang_env import fresh_sglang, import_sglang, plugin_reset  # noqa: F401 (a fixture)

sglang = import_sglang()

from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from detent_rl.rollout import sglang_plugin as P  # noqa: E402

plugin_reset()  # records the hooked attributes before any test applies a hook


def test_an_unsupported_sglang_is_refused_by_name():
    assert P.check_version() == importlib.metadata.version("sglang") and P.check_version() in P.SUPPORTED_VERSIONS
    with pytest.raises(P.SGLangPluginError, match=r"supports sglang 0\.5\.17, 0\.5\.23; this is sglang 0\.5\.22"):
        P.check_version("0.5.22")


@pytest.mark.skipif(importlib.metadata.version("sglang") in P.TRANSCRIBED_FOR["fused_moe"],
                    reason="this SGLang's fused-MoE config is pinned (tests/test_sglang_differential.py)")
def test_an_untranscribed_moe_config_is_refused_before_the_kernel(fresh_sglang, monkeypatch):
    """On a release whose MoE tables were not transcribed (0.5.17), SGLang's own config look-up, hooked, refuses
    instead of choosing by the token count. Control: unhooked, it returns a config for any M."""
    exec_ctx = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=False))
    monkeypatch.setattr(F, "get_exec", lambda: exec_ctx)  # what a server's runtime context would publish
    monkeypatch.setattr(F, "get_device_name", lambda: "NVIDIA H200")  # what CUDA would report
    assert F.try_get_optimal_moe_config((128, 1536, 2048), (128, 2048, 768), 8, None, 7)["BLOCK_SIZE_M"] > 0
    P.register()
    HookRegistry.apply_hooks()
    with pytest.raises(P.SGLangPluginError, match=r"fused-MoE config row on sglang 0\.5\.23 only.*this is sglang"):
        F.try_get_optimal_moe_config((128, 1536, 2048), (128, 2048, 768), 8, None, 7)


@pytest.mark.skipif(importlib.metadata.version("sglang") in P.TRANSCRIBED_FOR["allreduce"],
                    reason="this SGLang's all-reduce is pinned (tests/test_sglang_allreduce.py)")
def test_an_untranscribed_allreduce_is_refused_over_two_ranks(fresh_sglang):
    """On a release whose all-reduce choice was not transcribed (0.5.17), a device all-reduce over two ranks
    is refused by the hooked GroupCoordinator before it runs; one rank, or a CPU tensor, passes through."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    P.register()
    HookRegistry.apply_hooks()
    group = SimpleNamespace(world_size=2, unique_name="tp:0")
    device_tensor = SimpleNamespace(is_cpu=False)
    with pytest.raises(P.SGLangPluginError, match=r"tp:0: an all-reduce over 2 ranks on sglang .*0\.5\.23 only"):
        GroupCoordinator.all_reduce(group, device_tensor)
    one = SimpleNamespace(world_size=1, unique_name="tp:0")
    assert GroupCoordinator.all_reduce(one, torch.ones(3)).tolist() == [1.0, 1.0, 1.0]  # SGLang's one-rank return
