"""SiLU-and-mul, the gated activation of a Llama MLP: silu(gate) * up."""

import torch
import triton
import triton.language as tl

from kernels.pdl import pdl_args, pdl_wait

BLOCK = 1024


@triton.jit
def silu_mul_f32(gate, up):
    """silu(gate) * up of float32 values: the formula this file's kernel and the skinny
    kernel's gated loads (`kernels.skinny_gemm_parts.x_row`) share, so both round alike."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, INTER: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + offs, mask=mask, other=0.0).to(tl.float32)
    y = silu_mul_f32(gate, up)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x `[T, 2I]` (gate then up halves) -> silu(gate) * up `[T, I]`, computed in float32."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}"
    assert x.stride(1) == 1, "x must be contiguous along the last dim"
    T, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(T, inter, dtype=x.dtype, device=x.device)
    if T > 0:
        block = min(BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(T, triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), INTER=inter, BLOCK=block, **pdl_args(x.device)
        )  # fmt: skip
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference of `silu_and_mul`."""
    gate, up = x.float().chunk(2, dim=-1)  # [T, I] each
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
