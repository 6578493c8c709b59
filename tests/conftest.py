"""Test configuration: GPU tests are skipped without CUDA and selected on the device with -m gpu."""
from __future__ import annotations

import pytest

# First, before any test module imports transformers: importing detent_rl takes the checkout's root off
# sys.path (`python -m pytest` from the root puts it there), where our kernels/ folder would answer
# transformers' import of HuggingFace's `kernels` hub package (detent_rl/__init__.py).
import detent_rl  # noqa: F401,E402


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the device with `pytest -m gpu`)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _session_cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("selir-cache"))


@pytest.fixture(autouse=True)
def _session_cache(_session_cache_dir, monkeypatch):
    """One JIT-cache directory for the whole run (the subprocesses tests start inherit it), as a user's
    ~/.cache is: a site's program is solved once a run, not once a test (a matmul site's solve takes
    ~8 s on the CI machine; re-solving in every test made up most of the suite's time). Entries are
    keyed by the program, its facts and SelIR's source, written atomically and checksummed, so a test
    can only read the solve it would have made. Tests of the cache itself use their own directories."""
    monkeypatch.setenv("DETENT_CACHE_DIR", _session_cache_dir)
    monkeypatch.delenv("DETENT_CACHE_DISABLE", raising=False)


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread per test: two OpenMP threads on the shared 2-core runner spin against each
    other (matmuls run up to 100x slower)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
