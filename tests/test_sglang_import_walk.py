"""`bench/sglang_import_walk.py` finds a module that only a CUDA branch imports, which a plain CPU import walk
misses (session 26: SGLang 0.5.17's fp8 utilities import flashinfer on CUDA only, and the engine failed on the
device). Run on a stand-in package, in subprocesses (the walk patches torch.cuda)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

WALK = Path(__file__).resolve().parent.parent / "bench" / "sglang_import_walk.py"
MODULE = """import torch
if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
    import a_module_only_cuda_imports  # noqa: F401
"""


def _walk(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "cuda_branch_pkg.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, str(WALK), *flags, "cuda_branch_pkg"], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_walk_names_what_a_cuda_branch_imports(tmp_path):
    out = _walk(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "MISSING  a_module_only_cuda_imports (from cuda_branch_pkg" in out.stdout
    assert "1 missing: a_module_only_cuda_imports" in out.stdout


def test_control_a_cpu_walk_and_an_older_gpu_miss_it(tmp_path):
    for flags in (("--cpu",), ("--capability", "8.0")):
        out = _walk(tmp_path, *flags)
        assert out.returncode == 0 and "0 missing: none" in out.stdout, (flags, out.stdout + out.stderr)
