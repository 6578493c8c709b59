"""Names SGLang's multimodal modules bind at import (never called by the tests)."""
import enum


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name):  # Compose, Resize, Normalize, ...: classes bound at import, never instantiated
    return type(name, (), {})
