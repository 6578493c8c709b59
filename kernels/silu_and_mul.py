"""SiLU-and-mul of the gated MLP: x [rows, 2d] -> silu(x[:, :d]) * x[:, d:] [rows, d].

Semantics are HF's `act_fn(gate_proj(x)) * up_proj(x)` in the model dtype:
    s   = (g / (1 + exp(-g))).to(dtype)        with g = gate.float()
    out = (s.float() * up.float()).to(dtype)   (for fp32 both roundings are no-ops)
Elementwise: no reduction, so `block` only tiles the row and every row is batch-invariant.
The GPU's exp is Triton's (`tl.exp`), so its silu can differ from torch's by an fp32 ulp before
rounding; both sides of a rollout/trainer pair use this kernel, so they agree.
"""
import torch
import torch.nn.functional as F

from detent_rl.kernels._triton import FLOAT_DTYPES, check_block, pdl, pdl_enter, require_triton, tl, triton, use_triton
from detent_rl.kernels.launch import launch


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    dtype = out_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0)
    s = (g / (1.0 + tl.exp(-g))).to(dtype)
    tl.store(out_ptr + row * d + cols, (s.to(tl.float32) * u.to(tl.float32)).to(dtype), mask=mask)


def _silu_and_mul_triton(x: torch.Tensor, block: int) -> torch.Tensor:
    require_triton(x)
    x = x.contiguous()
    rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows > 0 and d > 0:
        launch(_silu_and_mul_kernel, (rows, triton.cdiv(d, block)), x, out, d, BLOCK=block, **pdl(x))
    return out


def _silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    # Not F.silu: its CPU kernel runs vector and scalar code paths that round differently, and
    # which one an element takes depends on the tensor's size (measured: rows differ between a
    # 1-row and a 64-row call when d is not a multiple of 16). exp alone is the same on both.
    d = x.shape[1] // 2
    g = x[:, :d].float()
    s = (g / (1.0 + torch.exp(-g))).to(x.dtype)
    return (s.float() * x[:, d:].float()).to(x.dtype)


def silu_and_mul(x: torch.Tensor, *, block: int) -> torch.Tensor:
    assert x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [rows, 2d], got {tuple(x.shape)}"
    assert x.dtype in FLOAT_DTYPES, f"unsupported dtype {x.dtype}"
    check_block(block)
    if use_triton(x):
        return _silu_and_mul_triton(x, block)
    return _silu_and_mul_torch(x)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[1] // 2
    return F.silu(x[:, :d]) * x[:, d:]


@triton.jit
def _silu_and_mul_backward_kernel(x_ptr, g_ptr, dx_ptr, d, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    dtype = dx_ptr.dtype.element_ty
    a = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-a))
    silu = (a * sig).to(dtype).to(tl.float32)
    gb = (g * b).to(dtype).to(tl.float32)
    tl.store(dx_ptr + row * 2 * d + cols, (gb * sig * (1.0 + a * (1.0 - sig))).to(dtype), mask=mask)
    tl.store(dx_ptr + row * 2 * d + d + cols, (g * silu).to(dtype), mask=mask)


def silu_and_mul_backward(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of `silu_and_mul` at x [rows, 2d] for the output's gradient g [rows, d] (the
    trainer's backward; not pinned, only deterministic): with x = [a | b], db = g * silu(a) and
    da = silu'(a) * (g * b), rounded as autograd rounds HF's formula in the model dtype (silu(a) and
    g * b to the dtype first). One kernel on the GPU."""
    assert x.dim() == 2 and g.shape == (x.shape[0], x.shape[1] // 2), "g must be [rows, d] for x [rows, 2d]"
    if use_triton(x):
        return _silu_and_mul_backward_triton(x, g)
    return _silu_and_mul_backward_torch(x, g)


def _silu_and_mul_backward_triton(x: torch.Tensor, g: torch.Tensor, block: int = 1024) -> torch.Tensor:
    require_triton(x)
    x, g = x.contiguous(), g.contiguous()
    rows, d = g.shape
    dx = torch.empty_like(x)
    if rows > 0 and d > 0:
        launch(_silu_and_mul_backward_kernel, (rows, triton.cdiv(d, block)), x, g, dx, d, BLOCK=block, **pdl(x))
    return dx


def _silu_and_mul_backward_torch(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    d = x.shape[1] // 2
    a, b = x[:, :d], x[:, d:]
    dx = torch.empty_like(x)
    torch.mul(g, F.silu(a), out=dx[:, d:])
    dx[:, :d] = torch.ops.aten.silu_backward(g * b, a)
    return dx
