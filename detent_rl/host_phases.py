"""Where a step's host time goes, by real time: named functions wrapped with a clock for the duration of a block.

cProfile times every Python call and inflates Python-heavy code several times over (an eager attention call read
0.19 ms under it); the profiler's CPU events see only torch ops. Here a few named functions (`module:attr` or
`module:Class.method`) are wrapped with `time.perf_counter` around each call while the block runs, and restored
after: each reports its calls and inclusive host seconds. Nothing waits for the device, so a kernel launch counts
its host side only, and a call that reads device results (`.tolist()`) counts its wait, as the step does.

    with host_phases(["detent_rl.kernels.autograd:paged_attention", ...]) as phases:
        for _ in range(steps):
            engine._step(spans)
    print(phases.table(steps))
"""
from __future__ import annotations

import functools
import importlib
import time
from contextlib import contextmanager
from typing import Iterator


class Phases:
    """Calls and inclusive host seconds of each wrapped target, in the order the targets were named."""

    def __init__(self, targets: list[str]) -> None:
        self.calls = {t: 0 for t in targets}
        self.seconds = {t: 0.0 for t in targets}

    def table(self, steps: int) -> str:
        """A markdown table: each target's calls a step, µs a step and µs a call (inclusive of what it calls)."""
        rows = ["| function | calls/step | µs/step | µs/call |", "|---|---|---|---|"]
        for t, n in self.calls.items():
            s = self.seconds[t] * 1e6
            rows.append(f"| {t} | {n / steps:g} | {s / steps:.1f} | {s / n if n else 0.0:.2f} |")
        return "\n".join(rows)


def _resolve(target: str) -> tuple[object, str]:
    """(owner, attribute) of 'pkg.module:attr' or 'pkg.module:Class.method'."""
    module, _, path = target.partition(":")
    if not path:
        raise ValueError(f"host_phases target {target!r}: expected 'module:attr' or 'module:Class.method'")
    owner = importlib.import_module(module)
    *outer, attr = path.split(".")
    for name in outer:
        owner = getattr(owner, name)
    if not hasattr(owner, attr):
        raise ValueError(f"host_phases target {target!r}: {owner!r} has no attribute {attr!r}")
    return owner, attr


@contextmanager
def host_phases(targets: list[str]) -> Iterator[Phases]:
    """Wrap each target with a clock for the block (see the module's docstring); the originals come back after,
    whatever the block raises. A target reached under another name (`from m import f` elsewhere) is its own
    target: name each module's binding that the code under test calls."""
    phases = Phases(targets)
    patched = []
    try:
        for target in targets:
            owner, attr = _resolve(target)
            inherited = isinstance(owner, type) and attr not in owner.__dict__  # (torch.Tensor.to: a base's)
            original = owner.__dict__[attr] if isinstance(owner, type) and not inherited else getattr(owner, attr)
            func = original.__func__ if isinstance(original, staticmethod) else original

            def timed(*args, _func=func, _target=target, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _func(*args, **kwargs)
                finally:
                    phases.seconds[_target] += time.perf_counter() - t0
                    phases.calls[_target] += 1

            wrapped = functools.wraps(func)(timed)
            setattr(owner, attr, staticmethod(wrapped) if isinstance(original, staticmethod) else wrapped)
            patched.append((owner, attr, None if inherited else original))
        yield phases
    finally:
        for owner, attr, original in reversed(patched):
            if original is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
