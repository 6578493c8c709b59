"""Test configuration: GPU tests are skipped without CUDA and selected on the device with -m gpu."""
from __future__ import annotations

import pytest


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


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own JIT-cache directory so tests never see each other's solves."""
    monkeypatch.setenv("DETENT_CACHE_DIR", str(tmp_path / "selir-cache"))
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
