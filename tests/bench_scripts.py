"""A `bench/` script loaded as a module, for the CPU tests of its logic (its own imports of bench/ siblings work)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "bench"


def load(name: str):
    """`bench/<name>.py` as a module."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))
