"""The interpreter's `tl.dot` in `run_interpreted` (tests/ordered_dot.py): an output row's bits do not
depend on where the row sits in the block, on a CPU whose BLAS makes them depend on it. OpenBLAS's
AVX2 (Haswell) sgemm kernel is that CPU's: any x86-64 CI machine with AVX2 can run it, so the
control is forced here rather than left to whichever machine CI gets."""
from __future__ import annotations

import platform

import numpy as np
import pytest

from interpreted import run_interpreted

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="OpenBLAS's x86 kernels")

MOVED = """
import torch, triton, triton.language as tl
import ordered_dot
from triton.runtime import interpreter

@triton.jit
def dot_kernel(a, b, c, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    x = tl.load(a + m[:, None] * K + k[None, :])
    y = tl.load(b + k[:, None] * N + n[None, :])
    tl.store(c + m[:, None] * N + n[None, :], tl.dot(x, y))

def run(a, b):
    c = torch.empty(a.shape[0], b.shape[1])
    dot_kernel[(1,)](a, b, c, a.shape[0], a.shape[1], b.shape[1])
    return c

g = torch.Generator().manual_seed(0)
a, b = torch.randn(32, 64, generator=g), torch.randn(64, 32, generator=g)

def moved():
    # rows whose bits change when the same rows sit at other positions of the block
    full = run(a, b)
    assert (full - a @ b).abs().max() < 1e-4
    return sum(not torch.equal(full.roll(-s, 0), run(a.roll(-s, 0), b)) for s in range(1, 32))

ordered = moved()
interpreter.InterpreterBuilder.create_dot = ordered_dot._blas_dot  # the interpreter's own: np.matmul
print("moved", ordered, moved())
"""


def test_a_rows_dot_bits_do_not_follow_its_block_position_where_blas_s_do(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    proc = run_interpreted(MOVED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ordered, blas = (int(v) for v in proc.stdout.split("moved")[-1].split())
    assert ordered == 0, f"{ordered} of 31 shifts changed a row's bits under the ordered dot"
    assert blas > 0, "control: numpy's matmul on OpenBLAS's AVX2 kernel should move a row's bits with it"


def test_ordered_matmul_is_each_elements_own_k_ordered_sum():
    from ordered_dot import ordered_matmul
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 16, 48)).astype(np.float16)
    b = rng.standard_normal((48, 24)).astype(np.float16)
    out = ordered_matmul(a, b, np.float32)
    assert out.shape == (2, 16, 24) and out.dtype == np.float32
    for i, m, n in [(0, 0, 0), (1, 15, 23), (0, 7, 11)]:
        acc = np.float32(0)
        for k in range(48):
            acc = np.float32(acc + np.float32(a[i, m, k]) * np.float32(b[k, n]))
        assert out[i, m, n] == acc
