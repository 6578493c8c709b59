"""transforms.v2 names that transformers < 5.13 binds at import when torchvision looks installed (never called)."""
from .. import InterpolationMode  # noqa: F401


def __getattr__(name):
    return type(name, (), {})
