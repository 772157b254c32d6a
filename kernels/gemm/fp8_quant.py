"""Per-token dynamic fp8 quantization of activations, the input side of an fp8 matmul.

Each row x of `[T, K]` becomes `q = clamp(x / s, -448, 448)` in float8_e4m3fn with one float32
scale `s = amax(|x|) / 448` (1.0 for an all-zero row), so `x ~= q * s`. One program per row:
a first pass over the row finds amax, a second quantizes (the row is still in L2). Scales
stay on the device: nothing here syncs the host, so it runs inside a CUDA graph.
`per_token_group_fp8` gives each `group` columns of a row a scale of their own (the input side
of a block-scaled matmul, `kernels.gemm.block_fp8`), as rows of a reshaped view.
"""

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 4096


@triton.jit
def _per_token_fp8_kernel(
    x_ptr, q_ptr, scale_ptr, stride_x, stride_q, K: tl.constexpr, BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    top = tl.max(amax, axis=0)
    scale = tl.where(top > 0, top / FP8_MAX, 1.0)
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < K
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
        tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x `[T, K]` (any float dtype) -> (q `[T, K]` float8_e4m3fn, scales `[T, 1]` float32)."""
    assert x.dim() == 2, f"x must be [T, K], got {tuple(x.shape)}"
    assert x.stride(1) == 1, "x must be contiguous along the last dim"
    T, K = x.shape
    q = torch.empty(T, K, dtype=FP8, device=x.device)
    scale = torch.empty(T, 1, dtype=torch.float32, device=x.device)
    if T > 0:
        block = min(BLOCK, triton.next_power_of_2(K))
        _per_token_fp8_kernel[(T,)](
            x, q, scale, x.stride(0), q.stride(0), K=K, BLOCK=block, FP8_MAX=FP8_MAX,
            num_warps=max(1, min(8, block // 512)),
        )  # fmt: skip
    return q, scale


def per_token_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `per_token_fp8`, in float32."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)  # [T, 1]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # [T, 1]
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def per_token_group_fp8(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x `[T, K]`, K a multiple of `group` -> (q `[T, K]` float8_e4m3fn, scales `[T, K / group]`
    float32): each `group` columns of a row quantized on their own (`per_token_fp8` over the
    `[T * K / group, group]` view)."""
    T, K = x.shape
    assert K % group == 0, f"K = {K} is not a multiple of the group size {group}"
    q, scale = per_token_fp8(x.contiguous().view(T * K // group, group))
    return q.view(T, K), scale.view(T, K // group)


def per_token_group_fp8_ref(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `per_token_group_fp8`, in float32."""
    T, K = x.shape
    q, scale = per_token_fp8_ref(x.reshape(T * K // group, group))
    return q.view(T, K), scale.view(T, K // group)
