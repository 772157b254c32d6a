"""FP8 weights (`--quantization fp8`): a linear layer holding float8_e4m3fn weights with one
float32 scale per output channel, quantized at load from a 16-bit checkpoint.

At most `WEIGHT_ONLY_ROWS` tokens (decode batches) can run weight-only: the activations stay
in 16 bits and the product is `y[t, o] = s_w[o] * (x q_w^T)[t, o]`, on CUDA one
`kernels.skinny_gemm` launch that streams the fp8 weight and widens it in registers (the
step is bound by weight bytes, and quantizing the few activation rows would cost more than
it saves). They do so on CUDA wherever the measured table (`use_kernel`) does not say the
tensor-core path below was faster for that row count and weight shape. Other batches
quantize each token's activations too, with a scale of their own (dynamic, per token:
`kernels.fp8_quant`), and the product is `y[t, o] = s_x[t] * s_w[o] * (q_x q_w^T)[t, o]`. On
a CUDA device with fp8 matmul (compute capability 8.9+) that is one `torch._scaled_mm`
(row-wise scales, bf16 out); elsewhere, and for shapes `_scaled_mm` refuses (a dim not a
multiple of 16), the same numbers are computed by dequantizing the operands and multiplying
in float32: correct, not fast. Float16 and float32 models get the bf16 product cast to their
dtype (row-wise `_scaled_mm` writes bf16 only). Per-output-channel scales make fused and
sharded weights simple: the rows of Q, K and V (or gate and up) quantize independently, and
a row-parallel shard is quantized over the columns it holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.fp8_quant import FP8, FP8_MAX, per_token_fp8, per_token_fp8_ref
from kernels.skinny_gemm import MAX_ROWS, skinny_gemm
from kernels.skinny_gemm_configs import use_kernel
from runtime.worker.ops import GateAct

MIN_CAPABILITY = (8, 9)  # Ada and Hopper onwards have fp8 tensor cores
SCALED_MM_ALIGN = 16  # _scaled_mm wants both weight dims a multiple of this
WEIGHT_ONLY_ROWS = MAX_ROWS  # up to this many tokens the activations are not quantized


class QuantizationError(ValueError):
    """The device cannot run the asked-for weight quantization."""


def check_fp8_support(device: torch.device, capability: tuple[int, int] | None = None) -> None:
    """Raise QuantizationError unless `device` runs fp8 weights: the CPU does (dequantizing),
    a CUDA device needs fp8 matmul. `capability` overrides the device's (for tests)."""
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise QuantizationError(f"--quantization fp8 runs on CUDA or the CPU, not {device}")
    cap = capability or torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else str(device)
        raise QuantizationError(
            f"--quantization fp8 needs fp8 matmul (CUDA compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+: Ada, Hopper or newer); "
            f"{name} is {cap[0]}.{cap[1]}; serve it with --quantization none")


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w `[out, in]` -> (q `[out, in]` float8_e4m3fn, scale `[out]` float32) with
    w ~= q * scale[:, None]; scale = amax(|row|) / 448 (1.0 for an all-zero row)."""
    w = w.float()
    amax = w.abs().amax(dim=1)  # [out]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # [out]
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def _scaled_mm_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    out, k = weight.shape
    return x.is_cuda and out % SCALED_MM_ALIGN == 0 and k % SCALED_MM_ALIGN == 0


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None,
               gate_act: GateAct | None = None) -> torch.Tensor:
    """x `[T, in]` times fp8 `weight` `[out, in]` with `weight_scale` `[out]` (+ bias) ->
    `[T, out]` in x's dtype: weight-only up to `WEIGHT_ONLY_ROWS` tokens (on CUDA where the
    kernel wins or `_scaled_mm` cannot run), above that the activations quantized per token.
    With `gate_act` (the MLP's silu-and-mul), x is `[T, 2 * in]` and the product is taken of
    gate_act(x), computed first (taking it in the kernel's loads measured slower with fp8
    weights: `runtime.worker.models.dense_linear.fuses_gate`). No host sync."""
    if gate_act is not None:
        x = gate_act(x)  # [T, in]
    t = x.shape[0]
    scaled_mm = _scaled_mm_ok(x, weight)
    if 0 < t <= WEIGHT_ONLY_ROWS and not x.is_cuda:
        y = F.linear(x.float(), weight.float() * weight_scale[:, None])  # [T, out] f32
        return (y if bias is None else y + bias.float()).to(x.dtype)
    if 0 < t <= WEIGHT_ONLY_ROWS and (not scaled_mm or use_kernel(True, t, *weight.shape)):
        return skinny_gemm(x.contiguous(), weight, weight_scale, bias)  # [T, out]
    if scaled_mm:
        xq, xs = per_token_fp8(x)  # [T, in] fp8, [T, 1] f32
        fused = bias if bias is not None and bias.dtype == torch.bfloat16 else None
        y = torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=weight_scale.view(1, -1),
                             bias=fused, out_dtype=torch.bfloat16)  # [T, out]
        if bias is not None and fused is None:
            y = y + bias
        return y.to(x.dtype)
    xq, xs = per_token_fp8_ref(x)  # [T, in] fp8, [T, 1] f32
    w = weight.float() * weight_scale[:, None]  # [out, in] f32
    y = F.linear(xq.float() * xs, w)  # [T, out] f32
    return (y if bias is None else y + bias.float()).to(x.dtype)


def fp8_linear_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Reference of an fp8 linear from its 16-bit weight `w` `[out, in]`: quantize w per
    output channel and, above `WEIGHT_ONLY_ROWS` tokens, x `[T, in]` per token; dequantize,
    multiply in float32."""
    wq, ws = quantize_rows(w)
    xq, xs = per_token_fp8_ref(x) if x.shape[0] > WEIGHT_ONLY_ROWS else (x, 1.0)
    y = (xq.float() * xs) @ (wq.float() * ws[:, None]).t()  # [T, out] f32
    return (y if bias is None else y + bias.float()).to(x.dtype)


class Fp8Linear(nn.Module):
    """`nn.Linear`'s interface and parameter names, with an fp8 `weight` `[out, in]` and a
    float32 `weight_scale` `[out]` buffer; the bias stays in the model's dtype. The loader
    fills it through `load_rows` from 16-bit tensors."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8),
                                   requires_grad=False)
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        """x `[T, in]` (`[T, 2 * in]` with `gate_act`: see `fp8_linear`)."""
        return fp8_linear(x, self.weight, self.weight_scale, self.bias, gate_act)  # [T, out]

    def load_rows(self, start: int, w: torch.Tensor) -> None:
        """Quantize 16-bit rows `w` `[rows, in]` into output channels start..start+rows."""
        q, scale = quantize_rows(w.to(self.weight.device))
        self.weight.narrow(0, start, w.shape[0]).copy_(q)
        self.weight_scale.narrow(0, start, w.shape[0]).copy_(scale)

    def restore_storage(self) -> None:
        """`Module.to(dtype)` casts every floating tensor, fp8 and the scales included: give
        them back their storage dtypes (on the meta device, before memory is allocated)."""
        self.weight = nn.Parameter(self.weight.to(FP8), requires_grad=False)
        self.weight_scale = self.weight_scale.float()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, fp8")
