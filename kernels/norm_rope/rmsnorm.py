"""RMSNorm, optionally fused with the residual add that precedes it in a decoder layer."""

import torch
import triton
import triton.language as tl

from kernels.pdl import pdl_args, pdl_wait


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,  # [T, HIDDEN] contiguous
    h_ptr,  # [T, HIDDEN] contiguous, written only when HAS_RESIDUAL
    eps,
    stride_x,
    stride_r,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait
    pdl_wait(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)  # [BLOCK]
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # Round the sum to the model dtype first: the norm must see the residual stream it returns.
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * HIDDEN + offs, h, mask=mask)
        x = h
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / HIDDEN + eps)
    tl.store(out_ptr + row * HIDDEN + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x `[T, hidden]` times weight `[hidden]`, computed in float32.

    Without residual returns the normed `[T, hidden]` in x's dtype. With residual `[T, hidden]`
    returns `(rmsnorm(h) * weight, h)` where `h = x + residual` (rounded to x's dtype): both are
    NEW tensors; x and residual are left untouched.
    """
    assert x.dim() == 2, f"x must be [T, hidden], got {tuple(x.shape)}"
    T, hidden = x.shape
    assert weight.shape == (hidden,), f"weight {tuple(weight.shape)} must be [{hidden}]"
    assert x.stride(1) == 1 and weight.stride(0) == 1, "x and weight must be contiguous in hidden"
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (
            f"residual {residual.dtype} {tuple(residual.shape)} must match x "
            f"{x.dtype} {tuple(x.shape)}"
        )
        assert residual.stride(1) == 1, "residual must be contiguous in hidden"
    out = torch.empty(T, hidden, dtype=x.dtype, device=x.device)
    h = torch.empty_like(out) if residual is not None else out
    if T > 0:
        block = triton.next_power_of_2(hidden)
        r = residual if residual is not None else x
        _rmsnorm_kernel[(T,)](
            x, r, weight, out, h, eps, x.stride(0), r.stride(0),
            HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None,
            num_warps=min(max(block // 512, 1), 8), **pdl_args(x.device),
        )  # fmt: skip
    return out if residual is None else (out, h)


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Torch reference of `rmsnorm` (same return convention)."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return normed.to(x.dtype) if residual is None else (normed.to(x.dtype), h)
