"""Runs a snippet in a fresh interpreter under TRITON_INTERPRET=1 (Triton's CPU interpreter reads the
variable at import, so it cannot be switched on inside the test process): logic checks of the
Triton code paths only; GPU bits are the *_gpu tests'. Its `tl.dot` is `ordered_dot`'s, the same on
every CPU (numpy's BLAS is not)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_interpreted(code: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The finished process; the test's own folder is importable in it, and `tl.dot` sums each element in
    k order (`ordered_dot`). Skips without Triton."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", "import ordered_dot\n" + code], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
