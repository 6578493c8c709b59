"""SGLang's own package on a CPU machine, for the plugin's tests (tests/test_sglang_plugin.py).

`.ci/run` installs it after the README's test command: `pip install -e '.[sglang-test]'` (the
pure-Python modules SGLang's imports reach) and `pip install --no-deps` of SGLANG_NO_DEPS (SGLang's
declared closure pins another torch and CUDA packages). Without SGLang the tests skip.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest

STUBS = os.path.join(os.path.dirname(__file__), "sglang_stubs")
SGLANG_NO_DEPS = ("sglang==0.5.23", "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0")
PRELUDE = f"""
import sys
import transformers  # decides torchvision is absent before the stub is on the path
sys.path.append({STUBS!r})
"""


def import_sglang():
    """The sglang package (skips the calling test module without it), with the torchvision import stub
    on the path only after transformers has decided that torchvision is absent."""
    importlib.import_module("transformers")
    if STUBS not in sys.path:
        sys.path.append(STUBS)
    return pytest.importorskip("sglang", reason="SGLang's CPU tests need `pip install -e '.[sglang-test]'` and "
                                                 f"`pip install --no-deps {' '.join(SGLANG_NO_DEPS)}`")
