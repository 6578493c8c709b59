"""How our Triton (and Gluon) kernels are launched: the direct path, recorded launches replayed, compiles counted.

`launch(kernel, grid, ...)` is `kernel[grid](...)` with less of Triton's per-launch host work (every kernel module
launches through it; tests/test_pdl.py checks). `Recorded` keeps one launch of a call shape so that later ones go
straight into Triton's launcher with only the tensors swapped in (the warpgroup linear's plans). Both reproduce the
launch Triton's own path would make, version-gated to the Triton whose internals they read (3.6); anything else
takes Triton's own path. `counting_compiles` names the variants compiled meanwhile (the engine's warm-up, the bench).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from detent_rl.kernels._triton import env, interpreting, triton


_FAST: dict[str, object] = {}  # "parts": the Triton internals `launch` uses (None: Triton's own path), found once


def _fast_launch_parts() -> Optional[tuple]:
    """(driver, compute_cache_key, knobs, CompiledKernel) of the installed Triton, or None where its launch path is
    not the one `launch` reproduces (another layout of `JITFunction.device_caches`): then every launch takes
    Triton's own."""
    if "parts" not in _FAST:
        parts = None
        try:
            from triton import knobs
            from triton.compiler.compiler import CompiledKernel
            from triton.runtime import driver
            from triton.runtime.jit import compute_cache_key
            if tuple(int(v) for v in triton.__version__.split(".")[:2]) == (3, 6):  # the layout read here
                parts = (driver, compute_cache_key, knobs, CompiledKernel)
        except (ImportError, AttributeError, ValueError):
            pass
        _FAST["parts"] = parts
    return _FAST["parts"]  # type: ignore[return-value]


def _hooked(hook) -> bool:
    """Whether a Triton launch hook would run: Triton 3.6's hooks are `HookChain`s, never None, empty (`.calls`)
    unless a profiler added one; an older Triton's are None or a callable."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _usable_parts() -> Optional[tuple]:
    """`_fast_launch_parts()` where a launch may bypass Triton's `run` now: not under the interpreter, no launch
    hooks (profilers), not DETENT_LAUNCH=triton (A/B); else None."""
    parts = None if interpreting() else _fast_launch_parts()
    if parts is None or env("DETENT_LAUNCH") == "triton":
        return None
    runtime = parts[2].runtime
    return None if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook) else parts


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`, with less of Triton's per-launch host work.

    Triton's `JITFunction.run` binds and specialises the arguments (its generated binder), looks the compiled
    kernel up by that specialisation's key, then, per launch, re-reads its knobs, checks the kernel's globals and
    builds launch metadata before the driver's launcher runs: 20-25 µs a launch on the H200's host, of which the
    binder is ~3-5 and the launcher ~5-8; this path takes ~3.5 µs less, our wrappers ~7 µs less (docs/BENCHMARKS.md,
    sessions 28 and 29). Here the same binder and the same key find
    the same compiled kernel in Triton's own cache, which the launcher then runs with the same bound arguments:
    the very variant `run` would launch, so bits cannot change. Anything this path does not reproduce takes
    Triton's own: a kernel not compiled yet (Triton compiles it and caches it for the next call), launch hooks
    (profilers), pre-run hooks, a callable grid, the interpreter, another Triton, DETENT_LAUNCH=triton (A/B).
    Not re-checked per launch: that the kernel's global constants have not changed since it was compiled (ours
    are module constants)."""
    found = None if callable(grid) else compiled_call(kernel, *args, **kwargs)
    if found is None:
        kernel[grid](*args, **kwargs)
        return
    compiled, bound, device = found
    stream = _fast_launch_parts()[0].active.get_current_stream(device)
    size = len(grid)
    # No launch metadata and no hooks (both chains are empty): the launcher then skips them, as `run`'s would.
    compiled.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, compiled.function,
                 compiled.packed_metadata, None, None, None, *bound)


def compiled_call(kernel, *args, **kwargs) -> Optional[tuple]:
    """(compiled kernel, its launcher's bound arguments, device) that `launch(kernel, grid, *args, **kwargs)` runs:
    the same binder and key find the very variant Triton's `run` would launch. None where Triton's own path must
    run: `_usable_parts` says no, pre-run hooks, or the variant is not compiled yet (or compiling asynchronously: a
    future)."""
    parts = _usable_parts()
    if parts is None or kernel.pre_run_hooks:
        return None
    driver, cache_key, knobs, compiled_type = parts
    device = driver.active.get_current_device()
    kernel_cache, key_cache, _, _, binder = kernel.device_caches[device]
    options = dict(kwargs, debug=kwargs.get("debug", kernel.debug) or knobs.runtime.debug,
                   instrumentation_mode=knobs.compilation.instrumentation_mode)  # as `run` completes them
    bound, specialization, options = binder(*args, **options)
    compiled = kernel_cache.get(cache_key(key_cache, specialization, options))
    if type(compiled) is not compiled_type:
        return None
    return compiled, bound.values(), device


_MAX_MAPS = 8192
_TMA_MAPS: dict = {}  # (address, a recorded descriptor's slot) -> the TMA descriptor encoded for it


class Recorded:
    """One launch of a compiled Triton (or Gluon) kernel, recorded so that later launches of the same call shape run
    straight into Triton's launcher with only the tensors swapped in: the compiled variant and the launcher's
    arguments that Triton's own path would pass, so the same bits. The caller's key must fix everything the
    kernel's specialisation reads (the integer arguments' values, the pointers' 16-byte alignment, the
    descriptors' shapes and strides) and the grid. Each tensor argument, or the tensor behind a host TMA
    descriptor, has a role (`roles`: id of the recorded call's object -> name); a later launch names its tensors
    by role. A TMA descriptor is a pure function of its address and of what the slot fixes (shape, strides, TMA
    parameters), so each slot's is encoded once per address and kept (`_TMA_MAPS`): a weight's for good, an
    activation's while the caching allocator hands its block out again (Triton's wrapper encodes every one at every
    launch, ~1.5 µs each)."""

    __slots__ = ("raw", "base", "tensor_slots", "map_slots", "device")

    def __init__(self, raw, base, tensor_slots, map_slots, device):
        self.raw, self.base, self.device = raw, base, device
        self.tensor_slots, self.map_slots = tensor_slots, map_slots

    @classmethod
    def of(cls, kernel, grid: tuple, args: tuple, kwargs: dict, roles: dict) -> "Recorded | None | bool":
        """The record of `launch(kernel, grid, *args, **kwargs)` just made; None where it took Triton's own path
        (not compiled yet, hooks: ask again at a later launch); False where this launch cannot be replayed (a
        launcher with scratch memory or clusters, descriptors not lowered to TMA, a tensor without a role)."""
        found = compiled_call(kernel, *args, **kwargs)
        if found is None:
            return None
        return cls._of(*found, grid, roles)

    @classmethod
    def _of(cls, compiled, bound, device, grid, roles) -> "Recorded | bool":
        run = compiled.run
        if run.global_scratch_size or run.profile_scratch_size or getattr(run, "num_ctas", 1) != 1:
            return False
        raw, metas, indices = run.launch, [], set()
        if hasattr(raw, "__code__"):  # Triton's wrapper that encodes host TMA descriptors around the C launcher
            cells = dict(zip(raw.__code__.co_freevars, (c.cell_contents for c in raw.__closure__ or ())))
            raw, metas, indices = cells.get("launcher"), cells.get("tensordesc_meta"), cells.get("tensordesc_indices")
            if raw is None or not metas or None in metas or indices is None:
                return False
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

        # the launcher's arguments: grid, stream (per launch), function, cooperative, PDL, no metadata or hooks,
        # then the kernel's, each descriptor as its encoded map followed by its shape and strides
        base = [*grid, *(1,) * (3 - len(grid)), None, compiled.function, run.launch_cooperative_grid,
                run.launch_pdl, None, None, compiled.packed_metadata, None, None, None]
        tensor_slots, map_slots, k = [], [], 0
        for i, value in enumerate(bound):
            if i in indices:
                meta = metas[k]
                k += 1
                if meta["fp4_padded"] or id(value.base) not in roles:
                    return False
                fill = (meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                        list(meta["block_size"]), list(value.shape), list(value.strides),
                        1 if value.padding == "nan" else 0)
                # the slot's own key object (hashed by identity, where the fixed part of `fill` would be hashed
                # anew at every launch)
                map_slots.append((len(base), roles[id(value.base)], object(), fill))
                base.extend((None, *value.shape, *value.strides))
            elif id(value) in roles:
                tensor_slots.append((len(base), roles[id(value)]))
                base.append(None)
            elif hasattr(value, "data_ptr"):  # a tensor without a role: it would be replayed stale
                return False
            else:
                base.append(value)
        return cls(raw, base, tuple(tensor_slots), tuple(map_slots), device)

    def __call__(self, tensors: dict) -> bool:
        """Launch with `tensors` (role -> tensor); False (nothing launched) where a replay is not allowed now."""
        parts = _usable_parts()
        if parts is None:
            return False
        active = parts[0].active
        if active.get_current_device() != self.device:
            return False
        final = self.base.copy()
        final[3] = active.get_current_stream(self.device)
        for at, role in self.tensor_slots:
            final[at] = tensors[role]
        for at, role, slot, fill in self.map_slots:
            address = tensors[role].data_ptr()
            cu_map = _TMA_MAPS.get((address, slot))
            if cu_map is None:
                if len(_TMA_MAPS) >= _MAX_MAPS:
                    _TMA_MAPS.clear()
                cu_map = _TMA_MAPS[address, slot] = active.utils.fill_tma_descriptor(address, *fill)
            final[at] = cu_map
        self.raw(*final)
        return True


@contextmanager
def counting_compiles() -> Iterator[list[str]]:
    """While inside, the names of the Triton kernels compiled (one entry a variant: Triton's and Gluon's JIT,
    through `JITFunction._do_compile`), in order: a benchmark's timed run and the engine's warm-up report them.
    Where Triton is absent or compiles another way, nothing is counted."""
    names: list[str] = []
    try:
        from triton.runtime.jit import JITFunction
        real = JITFunction._do_compile
    except (ImportError, AttributeError):
        yield names
        return

    def counted(self, *args, **kwargs):
        names.append(self.fn.__name__)
        return real(self, *args, **kwargs)

    JITFunction._do_compile = counted
    try:
        yield names
    finally:
        JITFunction._do_compile = real

