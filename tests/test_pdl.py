"""Programmatic dependent launch (`kernels/_triton.pdl`) is safe only if every kernel launched with it
waits for its predecessor before it touches memory: each Triton kernel of ours must take the `PDL`
constexpr and begin with `pdl_enter(PDL)`, and each launch must pass `**pdl(...)` (which sets `PDL`
and `launch_pdl` together). Checked on the source, so a new kernel that forgets either fails here.
The bits with PDL on are the GPU tests' (docs/BENCHMARKS.md)."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import torch

from detent_rl.kernels._triton import env, pdl
from detent_rl.kernels.launch import _hooked

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def _jit_kernels(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Module-level Triton kernels: `@triton.jit` functions launched with a grid somewhere (`launch(kernel,
    grid, ...)`, or `kernel[grid](...)`, which `test_every_launch_goes_through_launch` refuses)."""
    launched = {n.value.id for n in ast.walk(tree)
                if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and isinstance(n.ctx, ast.Load)}
    launched |= {c.args[0].id for c in _launch_calls(tree) if c.args and isinstance(c.args[0], ast.Name)}
    jit = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)
           and any(ast.unparse(d) == "triton.jit" for d in f.decorator_list)}
    return {name: f for name, f in jit.items() if name in launched}


def _launch_calls(tree: ast.Module) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "launch"]


def _launches(tree: ast.Module, names: set[str]) -> list[ast.Call]:
    return [c for c in _launch_calls(tree) if c.args and isinstance(c.args[0], ast.Name) and c.args[0].id in names]


def _subscript_launches(tree: ast.Module, names: set[str]) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
            and isinstance(n.func.value, ast.Name) and n.func.value.id in names]


def test_every_kernel_waits_first_and_every_launch_passes_pdl():
    seen = 0
    for path in sorted(KERNELS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        kernels = _jit_kernels(tree)
        for name, f in kernels.items():
            assert "PDL" in [a.arg for a in f.args.args], f"{path.name}: {name} has no PDL parameter"
            body = [s for s in f.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            assert ast.unparse(body[0]) == "pdl_enter(PDL)", \
                f"{path.name}: {name} must begin with pdl_enter(PDL), begins with {ast.unparse(body[0])!r}"
        for call in _launches(tree, set(kernels)):
            passed = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
            assert any(p.startswith("pdl(") for p in passed), \
                f"{path.name}:{call.lineno}: {call.args[0].id} launched without **pdl(...)"
            seen += 1
    assert seen >= 13  # every launch site of the kernel modules was looked at


def test_every_launch_goes_through_launch():
    """`kernel[grid](...)` would take Triton's slower `JITFunction.run` (~25 µs of host a launch on the H200's host
    against ~15 through `kernels.launch.launch`, which finds the same compiled kernel by Triton's own key)."""
    direct = []
    for path in sorted(KERNELS.rglob("*.py")):
        if path.name == "launch.py":  # `launch` itself falls back to it
            continue
        tree = ast.parse(path.read_text())
        names = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)} | {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id.endswith("_kernel")}
        direct += [f"{path.name}:{c.lineno}" for c in _subscript_launches(tree, names)]
    assert direct == []


def test_pdl_is_off_on_the_cpu_and_when_disabled(monkeypatch):
    assert pdl(torch.zeros(1)) == {"PDL": False}  # no launch_pdl either: the interpreter would reject it
    monkeypatch.setenv("DETENT_PDL", "0")
    assert pdl(torch.zeros(1)) == {"PDL": False}


def test_env_reads_what_os_environ_holds_at_each_call(monkeypatch):
    monkeypatch.delenv("DETENT_TEST_ENV", raising=False)
    assert env("DETENT_TEST_ENV", "dflt") == "dflt" and env("DETENT_TEST_ENV") == ""
    monkeypatch.setenv("DETENT_TEST_ENV", "0")
    assert env("DETENT_TEST_ENV", "1") == "0"
    monkeypatch.setenv("DETENT_TEST_ENV", "été")
    assert env("DETENT_TEST_ENV") == "été" == os.environ["DETENT_TEST_ENV"]
    monkeypatch.delenv("DETENT_TEST_ENV")
    assert env("DETENT_TEST_ENV", "x") == "x"
    monkeypatch.setenv("DETENT_PDL", "0")
    assert pdl(torch.zeros(1)) == {"PDL": False}


def test_a_launch_hook_counts_only_when_it_would_run():
    """Triton 3.6's launch hooks are chains, never None: an empty one must not send launches to Triton's path
    (session 28's experiment did, so its direct path never ran), a chain with a call (a profiler's) must."""
    class Chain:
        def __init__(self):
            self.calls = []
    chain = Chain()
    assert not _hooked(chain) and not _hooked(None)
    chain.calls.append(print)
    assert _hooked(chain) and _hooked(print)
    try:
        from triton.knobs import HookChain
    except ImportError:
        return
    real = HookChain()
    assert not _hooked(real)
    real.add(print)
    assert _hooked(real)
