"""I/O names SGLang's utilities bind at import (sglang 0.5.17: `from torchvision.io import decode_jpeg`;
never called by the tests)."""


def __getattr__(name):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"torchvision.io.{name} is a test stub")
    return unavailable
