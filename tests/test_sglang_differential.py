"""The SelIR transcriptions of SGLang's selection (kernels/programs/sglang/) against SGLang's own
functions, from the installed sglang package, on the CPU (skipped without it; .ci/run installs it).
The Triton decode split count is compared in tests/test_sglang_plugin.py (its kernel runs interpreted)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_env import import_sglang, skip_unless_transcribed

import_sglang()
skip_unless_transcribed("fused_moe")

import triton  # noqa: E402
from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F  # noqa: E402

from detent_rl.kernels.programs.sglang import moe_config as MOE  # noqa: E402

MS = sorted({1, 2, 3, 5, 8, 12, 13, 24, 41, 48, 64, 96, 113, 128, 193, 256, 385, 512, 769, 1024, 1536, 1792, 2048,
             3072, 4095, 4096, 6000, 8192} | set(range(1, 8193, 97)))
CASES = [  # device, Triton version, deterministic inference
    ("NVIDIA H200", "3.6.0", False),  # the exact-version folder
    ("NVIDIA H200", "3.9.0", False),  # no such folder: the newest one holding the file
    ("NVIDIA H100 80GB HBM3", "3.7.1", False),  # an up and a _down table
    ("NVIDIA H100 80GB HBM3", "3.2.0", False),
    ("NVIDIA A10", "3.6.0", False),  # no tuned file: the default config
    ("NVIDIA H200", "3.6.0", True),  # deterministic inference: the default config
]


def _ours(flat: dict, which: str) -> tuple[dict, bool]:
    """One config of the transcription's flattened selection as SGLang's dict (num_warps / num_stages
    0 = absent), and its USE_TMA."""
    cfg = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(which + ".")}
    tma = cfg.pop("USE_TMA")
    return {k: v for k, v in cfg.items() if v or k not in ("num_warps", "num_stages")}, tma


def _theirs(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "USE_TMA"}


@pytest.mark.parametrize("device,version,deterministic", CASES)
def test_moe_config_equals_sglang(monkeypatch, device, version, deterministic):
    """Qwen3-30B-A3B's experts (E 128, N 768, top-8, bf16): SGLang's try_get_optimal_moe_config reading
    its shipped JSON tables, against the transcription, at every M of a grid up to 8,192 tokens; the
    up config, the down config (with the up BLOCK_SIZE_M) and each row's USE_TMA flag."""
    monkeypatch.setattr(F, "get_device_name", lambda: device)
    monkeypatch.setattr(triton, "__version__", version)
    exec_ctx = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=deterministic))
    monkeypatch.setattr(F, "get_exec", lambda: exec_ctx)
    F.get_moe_configs.cache_clear()
    key = (device.replace(" ", "_"), 128, 768, "", 0, 0, False, False)
    facts = {**MOE.REFERENCE_FACTS, "device_name": key[0], "triton_version": version,
             "tuned_config_shipped": key in MOE.CONFIG_FILES, "deterministic": deterministic}
    sources = set()
    try:
        for m in MS:
            up, (down, _) = F.try_get_optimal_moe_config((128, 1536, 2048), (128, 2048, 768), 8, None, m,
                                                         return_down_config=True)
            ours = MOE.fused_moe_config(M=m, **facts)
            sources.add(ours["source"])
            assert (_theirs(up), bool(up.get("USE_TMA", False))) == _ours(ours, "up"), (m, up, ours)
            if down is None:  # SGLang's caller runs `down_config or config`, without TMA
                assert _ours(ours, "down") == _ours(ours, "up") and not ours["down_use_tma"], (m, ours)
            else:
                assert (_theirs(down), bool(down.get("USE_TMA", False))) == _ours(ours, "down"), (m, down, ours)
    finally:
        F.get_moe_configs.cache_clear()
    assert sources == ({"default"} if deterministic or key not in MOE.CONFIG_FILES else {"tuned"})
