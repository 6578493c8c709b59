"""The distribution installs only under the detent_rl namespace."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_subpackages_import_under_detent_rl():
    import detent_rl.kernels
    import detent_rl.rollout
    import detent_rl.selir
    import detent_rl.trainer

    assert Path(detent_rl.selir.__file__).parent == REPO / "selir"
    assert Path(detent_rl.kernels.__file__).parent == REPO / "kernels"


def test_no_top_level_kernels_trainer_or_rollout_of_ours():
    for name in ("kernels", "trainer", "rollout", "selir"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            assert not Path(spec.origin).resolve().is_relative_to(REPO), f"{name} resolves to our tree: {spec.origin}"


def test_distribution_declares_only_the_detent_rl_package():
    dist = importlib.metadata.distribution("detent-rl")
    text = (REPO / "pyproject.toml").read_text()
    for bad in ('"kernels"', '"trainer"', '"rollout"', '"selir"'):
        assert f"packages = [{bad}" not in text and f"\n    {bad}," not in text
    assert dist.metadata["Name"] == "detent-rl"


def test_transformers_imports_cleanly_beside_us():
    # transformers probes for HuggingFace's `kernels` hub package; ours must not answer that probe.
    code = ("import detent_rl.kernels, importlib.util, transformers; "
            "s = importlib.util.find_spec('kernels'); "
            "print('kernels-spec', None if s is None else s.origin); "
            "from transformers import PretrainedConfig; print('ok', transformers.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "ok " in out.stdout
    origin = out.stdout.split("kernels-spec ", 1)[1].split()[0]
    assert origin == "None" or not origin.startswith(str(REPO)), origin
