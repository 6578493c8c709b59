"""Programmatic dependent launch (`kernels/_triton.pdl`) is safe only if every kernel launched with it
waits for its predecessor before it touches memory: each Triton kernel of ours must take the `PDL`
constexpr and begin with `pdl_enter(PDL)`, and each launch must pass `**pdl(...)` (which sets `PDL`
and `launch_pdl` together), directly or through a name assigned from it. Before the wait a kernel may
only compute indices and ask L2 for its weights (PRE_WAIT: `matmul._prefetch_w`, a hint that reads
nothing into registers). Checked on the source, so a new kernel that forgets either fails here.
The bits with PDL on are the GPU tests' (docs/BENCHMARKS.md)."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from detent_rl.kernels._triton import pdl
from detent_rl.kernels.matmul import PREFETCH_MAX_M, prefetches

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def _jit_kernels(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Module-level Triton kernels: `@triton.jit` functions launched with a grid somewhere."""
    launched = {n.value.id for n in ast.walk(tree)
                if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and isinstance(n.ctx, ast.Load)}
    jit = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)
           and any(ast.unparse(d) == "triton.jit" for d in f.decorator_list)}
    return {name: f for name, f in jit.items() if name in launched}


PRE_WAIT = {"_tile_offsets", "_prefetch_w", "tl.program_id"}  # what a kernel may call before pdl_enter(PDL)


def _pre_wait_calls(statements: list[ast.stmt]) -> set[str]:
    """The functions the statements before `pdl_enter(PDL)` call."""
    return {ast.unparse(n.func) for s in statements for n in ast.walk(s) if isinstance(n, ast.Call)}


def _pdl_names(tree: ast.Module) -> set[str]:
    """Names assigned from `pdl(...)` in the module (a launch may pass `**launch` for `launch = pdl(x)`)."""
    return {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and ast.unparse(n.value.func) == "pdl" for t in n.targets if isinstance(t, ast.Name)}


def _launches(tree: ast.Module, names: set[str]) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
            and isinstance(n.func.value, ast.Name) and n.func.value.id in names]


def test_every_kernel_waits_first_and_every_launch_passes_pdl():
    seen = 0
    for path in sorted(KERNELS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        kernels = _jit_kernels(tree)
        for name, f in kernels.items():
            assert "PDL" in [a.arg for a in f.args.args], f"{path.name}: {name} has no PDL parameter"
            body = [ast.unparse(s) for s in f.body]
            assert "pdl_enter(PDL)" in body, f"{path.name}: {name} never calls pdl_enter(PDL)"
            extra = _pre_wait_calls(f.body[:body.index("pdl_enter(PDL)")]) - PRE_WAIT
            assert not extra, f"{path.name}: {name} calls {sorted(extra)} before pdl_enter(PDL)"
        pdl_names = _pdl_names(tree)
        for call in _launches(tree, set(kernels)):
            passed = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
            assert any(p.startswith("pdl(") or p in pdl_names for p in passed), \
                f"{path.name}:{call.lineno}: {call.func.value.id} launched without **pdl(...)"
            seen += 1
    assert seen >= 13  # every launch site of the kernel modules was looked at


def test_pdl_is_off_on_the_cpu_and_when_disabled(monkeypatch):
    assert pdl(torch.zeros(1)) == {"PDL": False}  # no launch_pdl either: the interpreter would reject it
    monkeypatch.setenv("DETENT_PDL", "0")
    assert pdl(torch.zeros(1)) == {"PDL": False}
    monkeypatch.setenv("DETENT_PDL", "early")
    assert pdl(torch.zeros(1)) == {"PDL": False}


def test_a_load_before_the_wait_is_caught():
    """Control: the check above refuses a kernel that reads memory before `pdl_enter(PDL)`."""
    src = ("@triton.jit\ndef k(x_ptr, PDL: tl.constexpr):\n    v = tl.load(x_ptr)\n    pdl_enter(PDL)\n"
           "    tl.store(x_ptr, v)\n")
    f = _jit_kernels(ast.parse(src + "k[(1,)](x, **pdl(x))\n"))["k"]
    body = [ast.unparse(s) for s in f.body]
    assert _pre_wait_calls(f.body[:body.index("pdl_enter(PDL)")]) - PRE_WAIT == {"tl.load"}


def test_the_weight_prefetch_is_for_memory_bound_calls_under_pdl(monkeypatch):
    w = torch.zeros(64, 896)
    on = {"PDL": True, "launch_pdl": True}
    assert prefetches(on, 1, w) and prefetches(on, PREFETCH_MAX_M, w)
    assert not prefetches(on, PREFETCH_MAX_M + 1, w), "a compute-bound call reads its weights many times"
    assert not prefetches({"PDL": False}, 1, w), "without PDL nothing runs before the predecessor ends"
    assert not prefetches(on, 1, torch.zeros(896, 64).t()), "lines are along w's contiguous rows"
    monkeypatch.setenv("DETENT_PREFETCH", "0")
    assert not prefetches(on, 1, w)
