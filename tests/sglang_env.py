"""SGLang's own package on a CPU machine, for the plugin's tests (tests/test_sglang_plugin.py).

`.ci/run` installs it after the README's test command: `pip install -e '.[sglang-test]'` (the
pure-Python modules SGLang's imports reach) and `pip install --no-deps` of SGLANG_NO_DEPS (SGLang's
declared closure pins another torch and CUDA packages). Without SGLang the tests skip.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys

import pytest

STUBS = os.path.join(os.path.dirname(__file__), "sglang_stubs")
SGLANG_NO_DEPS = ("sglang==0.5.23", "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0")
# The torch-2.11 stack's SGLang (the one whose sglang-kernel loads beside the H200's torch 2.11), tested
# against the same files after the above: it registers a config name that transformers >= 5.13 also
# registers, so it takes its own transformers (5.12.1) and what that transformers pins (tokenizers < 0.23,
# huggingface-hub < 2, which imports httpx), kernels < 0.15 and xgrammar (both imported by its
# server_args). Installed over the 0.5.23 environment, last.
SGLANG_0_5_17_NO_DEPS = ("sglang==0.5.17", "transformers==5.12.1", "tokenizers==0.22.2", "huggingface-hub==1.33.0",
                         "kernels==0.14.1", "xgrammar==0.2.1", "httpx==0.29.0", "httpcore==1.0.9",
                         "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0")


def _transformers_needs_torchvision() -> bool:
    """True where transformers registers image processors only with torchvision present (< 5.13, the
    transformers of the torch-2.11 SGLang stack, 0.5.15-0.5.17): the stub must be found when it looks.
    Newer transformers need it absent: they would use it for real."""
    try:
        major, minor = (int(part) for part in importlib.metadata.version("transformers").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) < (5, 13)


STUB_FIRST = _transformers_needs_torchvision()
PRELUDE = f"""
import sys
import detent_rl  # first: takes the checkout's root off sys.path before transformers looks for `kernels`
{"sys.path.append(" + repr(STUBS) + ")" if STUB_FIRST else ""}
import transformers  # decides whether torchvision is present (see tests/sglang_env.py)
sys.path.append({STUBS!r})
"""


def import_sglang():
    """The sglang package (skips the calling test module without it), with the torchvision import stub
    on the path only after transformers has decided that torchvision is absent (before it, for the
    transformers that need it present)."""
    if STUB_FIRST and STUBS not in sys.path:
        sys.path.append(STUBS)
    importlib.import_module("transformers")
    if STUBS not in sys.path:
        sys.path.append(STUBS)
    return pytest.importorskip("sglang", reason="SGLang's CPU tests need `pip install -e '.[sglang-test]'` and "
                                                 f"`pip install --no-deps {' '.join(SGLANG_NO_DEPS)}`")


def skip_unless_transcribed(what: str) -> None:
    """Skip the calling test module where the installed SGLang's `what` selection (a key of the plugin's
    TRANSCRIBED_FOR) was not transcribed: the plugin refuses that path there, which
    tests/test_sglang_plugin.py checks instead."""
    from detent_rl.rollout.sglang_plugin import TRANSCRIBED_FOR, check_version
    version = check_version()
    if version not in TRANSCRIBED_FOR[what]:
        pytest.skip(f"sglang {version}: its {what} selection is not transcribed (the plugin refuses it there)",
                    allow_module_level=True)


_PRISTINE: list = []
_INHERITED = object()  # a hooked attribute the class inherits (the registry sets it on the class itself)


def plugin_reset():
    """A function that puts back every class attribute the plugin hooks (as this process first saw it, so a
    test that applied the hooks cannot leak them into the next), empties SGLang's hook registry and the
    plugin's state. The first call must come before any hook is applied (test modules call it at import)."""
    import sglang.srt.plugins as sgl_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from detent_rl.rollout import sglang_model as M
    from detent_rl.rollout import sglang_plugin as P
    if not _PRISTINE:
        targets = [P.TRITON_BACKEND + ".__init__", P.TRITON_BACKEND + ".get_num_kv_splits",
                   P.FLASHINFER_BACKEND + ".__init__",
                   P.SAMPLING_PARAMS + ".verify", P.SAMPLING_BATCH + ".from_schedule_batch",
                   P.ALLREDUCE + ".__init__", P.ALLREDUCE + "._pick_config", P.ALLREDUCE + ".should_custom_ar",
                   P.GROUP + ".all_reduce"]
        targets += [target for target, _, _ in M.HOOKS]
        for target in targets:
            path, cls_name, attr = target.rsplit(".", 2)
            cls = getattr(importlib.import_module(path), cls_name)
            _PRISTINE.append((cls, attr, cls.__dict__.get(attr, _INHERITED)))  # inherited: deleted on reset
        path, name = P.MOE_CONFIG.rsplit(".", 1)
        moe = getattr(importlib.import_module(path), name)  # the registry also rebinds modules that import it
        _PRISTINE.extend((m, k, moe) for m in list(sys.modules.values())
                         if getattr(m, "__name__", "").startswith("sglang") for k, v in list(vars(m).items())
                         if v is moe)

    def reset():
        for owner, attr, value in _PRISTINE:
            if value is _INHERITED:
                if attr in vars(owner):
                    delattr(owner, attr)
            else:
                setattr(owner, attr, value)
        HookRegistry.reset()
        sgl_plugins._plugins_loaded = False
        P._STATE.update(registered=False, model_hooks=False, tile=None, moe_pins=None, moe_path=None, ar_pins=None)
        M.configure(None, None)
    return reset


@pytest.fixture
def fresh_sglang():
    """SGLang with no hook applied, before and after the test. A module takes it with `from sglang_env import
    fresh_sglang` and calls plugin_reset() at import, so the pristine attributes are recorded before any test
    applies a hook."""
    reset = plugin_reset()
    reset()
    yield
    reset()
