"""Programmatic dependent launch (`kernels/_triton.pdl`) is safe only if every kernel launched with it
waits for its predecessor before it writes, or reads what a kernel of the step may have written: each
Triton kernel of ours must take the `PDL` constexpr and call `pdl_enter(PDL)` on every path before any
store and before any load but of the host-fed pointers it is allowed (`HOST_FED`: the step's uploaded
metadata and the rope table, read while the predecessor runs), and each launch must pass `**pdl(...)`
(which sets `PDL` and `launch_pdl` together). Checked on the source, so a new kernel that forgets
either, or an early load of another pointer, fails here. The bits with PDL on are the GPU tests'
(docs/BENCHMARKS.md)."""
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


# kernel -> the pointers it reads before its wait: none of them written by the step's kernels after its upload (the
# attention's metadata and block table, the combine's token positions, the rotary store's positions, slots and the
# rope table; `pdl`'s docstring). Not `_rotary_kernel`: the trainer's backward passes it a `sin` negated just before
HOST_FED = {
    "_attention_kernel": {"tile_req_ptr", "tile_q0_ptr", "cu_q_ptr", "pos0_ptr", "bt_ptr"},
    "_combine_kernel": {"pos_ptr"},
    "_combine_heads_kernel": {"pos_ptr"},
    "_rotary_store_kernel": {"pos_ptr", "slot_ptr", "cos_ptr", "sin_ptr"},
}
WAIT = "pdl_enter(PDL)"


def _before_wait(body: list[ast.stmt], where: str) -> list[ast.stmt]:
    """The statements of `body` that run before its wait: those ahead of a `pdl_enter(PDL)` statement, or ahead of
    an `if` whose branches each wait (and each branch's own). AssertionError if some path reaches no wait."""
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    for i, stmt in enumerate(body):
        if ast.unparse(stmt) == WAIT:
            return body[:i]
        if isinstance(stmt, ast.If) and WAIT in ast.unparse(stmt):
            assert stmt.orelse, f"{where}: an `if` waits in one branch only"
            return body[:i] + [stmt.test] + _before_wait(stmt.body, where) + _before_wait(stmt.orelse, where)
        assert WAIT not in ast.unparse(stmt), f"{where}: waits inside {type(stmt).__name__}, not on every path"
    raise AssertionError(f"{where}: no path waits")


def _early_access(f: ast.FunctionDef) -> tuple[set[str], list[str]]:
    """(the pointer parameters `f` touches before its wait, the stores it makes there)."""
    early = _before_wait(f.body, f.name)
    pointers = {a.arg for a in f.args.args if a.arg.endswith("_ptr")}
    names = {n.id for s in early for n in ast.walk(s) if isinstance(n, ast.Name)}
    stores = [ast.unparse(n) for s in early for n in ast.walk(s) if isinstance(n, ast.Call)
              and ast.unparse(n.func).split(".")[-1] in ("store", "atomic_add", "atomic_xchg", "atomic_cas")]
    return names & pointers, stores


def test_every_kernel_waits_before_the_steps_memory_and_every_launch_passes_pdl():
    seen, early = 0, set()
    for path in sorted(KERNELS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        kernels = _jit_kernels(tree)
        for name, f in kernels.items():
            assert "PDL" in [a.arg for a in f.args.args], f"{path.name}: {name} has no PDL parameter"
            pointers, stores = _early_access(f)
            assert not stores, f"{path.name}: {name} stores before its wait: {stores}"
            assert pointers <= HOST_FED.get(name, set()), \
                f"{path.name}: {name} reads {sorted(pointers - HOST_FED.get(name, set()))} before its wait"
            early |= {name} if pointers else set()
        for call in _launches(tree, set(kernels)):
            passed = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
            assert any(p.startswith("pdl(") for p in passed), \
                f"{path.name}:{call.lineno}: {call.args[0].id} launched without **pdl(...)"
            seen += 1
    assert seen >= 13  # every launch site of the kernel modules was looked at
    assert early == set(HOST_FED), f"allowed early reads that no kernel makes: {set(HOST_FED) - early}"


def test_the_wait_check_refuses_an_early_read_of_the_predecessors_output():
    """Control: a kernel that loads its input (the predecessor's output) before the wait, one that stores before
    it, and one that waits in one branch only, each fail the check above."""
    src = """
def _k(x_ptr, pos_ptr, out_ptr, PDL: tl.constexpr):
    p = tl.load(pos_ptr)
    x = tl.load(x_ptr + p)
    pdl_enter(PDL)
    tl.store(out_ptr, x)

def _s(pos_ptr, out_ptr, PDL: tl.constexpr):
    tl.store(out_ptr, tl.load(pos_ptr))
    pdl_enter(PDL)

def _b(pos_ptr, PDL: tl.constexpr):
    if tl.program_id(0) > 0:
        pdl_enter(PDL)
"""
    k, st, b = ast.parse(src).body
    assert _early_access(k) == ({"x_ptr", "pos_ptr"}, [])
    assert _early_access(st)[1] == ["tl.store(out_ptr, tl.load(pos_ptr))"]
    try:
        _early_access(b)
    except AssertionError as e:
        assert "one branch only" in str(e)
    else:
        raise AssertionError("a wait in one branch only passed")


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
