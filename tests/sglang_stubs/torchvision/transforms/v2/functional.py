"""Functional names SGLang's multimodal modules bind at import (never called by the tests)."""
from .. import InterpolationMode

__all__ = ["InterpolationMode"]


def __getattr__(name):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"torchvision.transforms.v2.functional.{name} is a test stub")
    return unavailable
