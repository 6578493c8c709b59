"""The distribution installs only under the detent_rl namespace, and transformers is not confused."""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("kernels", "trainer", "rollout", "selir")


def _probe(code: str, cwd: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_subpackages_import_under_detent_rl():
    import detent_rl.kernels
    import detent_rl.rollout
    import detent_rl.selir
    import detent_rl.trainer

    assert Path(detent_rl.selir.__file__).parent == REPO / "selir"
    assert Path(detent_rl.kernels.__file__).parent == REPO / "kernels"
    assert Path(detent_rl.rollout.__file__).parent == REPO / "rollout"
    assert Path(detent_rl.trainer.__file__).parent == REPO / "trainer"


def test_install_provides_no_top_level_kernels_trainer_rollout(tmp_path):
    # From a neutral directory the interpreter sees only what was installed.
    code = ("import importlib.util, json; "
            f"print(json.dumps({{n: getattr(importlib.util.find_spec(n), 'origin', None) for n in {TOP_LEVEL!r}}}))")
    found = _probe(code, tmp_path)
    for name, origin in found.items():
        assert origin is None or not origin.startswith(str(REPO)), f"installing detent-rl exposed top-level {name}: {origin}"
    assert importlib.metadata.distribution("detent-rl").metadata["Name"] == "detent-rl"


@pytest.mark.parametrize("where", ["neutral", "repo-root"])
def test_transformers_imports_cleanly_beside_us(tmp_path, where):
    # transformers probes for HuggingFace's `kernels` hub package; ours must never answer that
    # probe, not even when the repository root is the working directory (`python -m ...`).
    code = ("import json, detent_rl.kernels, transformers; "
            "from transformers.utils.import_utils import is_kernels_available; "
            "from transformers import LlamaConfig, LlamaForCausalLM; "
            "m = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, "
            "num_attention_heads=2, num_key_value_heads=1, vocab_size=64)); "
            "print(json.dumps({'hub_kernels': is_kernels_available(), 'version': transformers.__version__}))")
    found = _probe(code, REPO if where == "repo-root" else tmp_path)
    try:
        hub = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        hub = None
    if hub is None:
        assert found["hub_kernels"] is False, "transformers mistook our kernels folder for the hub package"
