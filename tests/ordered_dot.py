"""Triton's interpreter with a `tl.dot` whose every output element is its own k-ordered sum.

The interpreter computes `tl.dot` with `np.matmul`, that is with the BLAS numpy was built with, and
OpenBLAS picks its sgemm kernel by the CPU it finds: on AVX2 machines (its Haswell and Zen kernels)
an output row's bits depend on where the row sits in the block (the kernel's edge and main paths sum
differently); its AVX-512 kernel happens not to. A kernel whose rows land at other block positions
with the batch (a chunked prompt's rows, a request at another batch index) then changes bits on one
CI machine and not on another, for a reason no GPU has: an MMA computes each element the same way
wherever it sits. Here each element is summed over k in order (fp32 products, then the accumulator
added once, as the interpreter's own `matmul(a, b) + d` does): slower than BLAS, the same on every
CPU. `run_interpreted` imports this module first in each snippet.
"""
from __future__ import annotations

import numpy as np
from triton.runtime import interpreter

_blas_dot = interpreter.InterpreterBuilder.create_dot


def ordered_matmul(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """a @ b (batched over leading axes) with every element summed over k in increasing order."""
    a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    out = np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), dtype)
    for k in range(a.shape[-1]):
        out += a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return out


def _ordered_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:  # fp8/int8 operands: as Triton does
        return _blas_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    return interpreter.TensorHandle(ordered_matmul(a.data, b.data, d.data.dtype) + d.data, d.dtype.scalar)


interpreter.InterpreterBuilder.create_dot = _ordered_dot
