"""detent_rl: on-policy RL whose trainer reproduces the rollout engine's logprobs bit for bit."""
from __future__ import annotations

import os
import sys
from pathlib import Path

__version__ = "0.1.0"

# The checkout's folders that install only as detent_rl.<name> (pyproject.toml's package-dir).
_CHECKOUT_FOLDERS = ("kernels", "trainer", "rollout", "selir")


def _keep_the_checkout_off_sys_path() -> None:
    """Take the repository root off sys.path when the interpreter put it there.

    `python -m detent_rl.train` (and `python -m pytest`, `python -c`) run from the checkout prepend the
    working directory, where kernels/, trainer/, rollout/ and selir/ would answer top-level imports.
    transformers >= 5.25 requires HuggingFace's `kernels` hub package and imports it by name when it
    loads a tokenizer or a model: our kernels/ answered, and the README's main command failed. The
    package's own modules are reached through the installed package mapping, not through the root, so
    nothing of ours needs the entry. Top-level modules already imported from those folders are dropped.
    """
    root = Path(__file__).resolve().parent.parent
    if not ((root / "pyproject.toml").is_file() and (root / "kernels" / "__init__.py").is_file()):
        return  # an installed copy (site-packages): no checkout beside it

    def is_root(entry: str) -> bool:
        try:
            return Path(entry or os.curdir).resolve() == root
        except (OSError, RuntimeError):
            return False

    sys.path[:] = [entry for entry in sys.path if not is_root(entry)]
    for name in _CHECKOUT_FOLDERS:
        origin = getattr(sys.modules.get(name), "__file__", None)
        if origin and Path(origin).resolve().parent == root / name:
            del sys.modules[name]


_keep_the_checkout_off_sys_path()
