"""FP8 weights: a linear layer holding float8_e4m3fn weights with one float32 scale per output
channel, quantized at load from a 16-bit checkpoint (`--quantization fp8`) or read from an fp8
checkpoint with per-channel or per-tensor scales (`runtime.worker.quant.scheme`). `Fp8Weights`
is what every fp8 layer shares (block scales: `block_fp8_linear`).

At most `WEIGHT_ONLY_ROWS` tokens (decode batches) can run weight-only: the activations stay
in 16 bits and the product is `y[t, o] = s_w[o] * (x q_w^T)[t, o]`, on CUDA one
`kernels.gemm.skinny` launch that streams the fp8 weight and widens it in registers (the
step is bound by weight bytes, and quantizing the few activation rows would cost more than
it saves). They do so on CUDA wherever the measured table (`use_kernel`) does not say the
tensor-core path below was faster for that row count and weight shape. Other batches
quantize each token's activations too, with a scale of their own (dynamic, per token:
`kernels.gemm.fp8_quant`), and the product is `y[t, o] = s_x[t] * s_w[o] * (q_x q_w^T)[t, o]`. On
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

from kernels.gemm.fp8_quant import FP8, FP8_MAX, per_token_fp8, per_token_fp8_ref
from kernels.gemm.skinny import MAX_ROWS, skinny_gemm
from kernels.gemm.skinny_configs import use_kernel
from runtime.worker.ops import GateAct
from runtime.worker.tp import TPGroup

MIN_CAPABILITY = (8, 9)  # Ada and Hopper onwards have fp8 tensor cores
SCALED_MM_ALIGN = 16  # _scaled_mm wants both weight dims a multiple of this
WEIGHT_ONLY_ROWS = MAX_ROWS  # up to this many tokens the activations are not quantized


class QuantizationError(ValueError):
    """The device cannot run the asked-for weight quantization."""


def check_fp8_support(device: torch.device, capability: tuple[int, int] | None = None,
                      what: str = "--quantization fp8",
                      instead: str = "serve it with --quantization none") -> None:
    """Raise QuantizationError unless `device` runs fp8 weights: the CPU does (dequantizing),
    a CUDA device needs fp8 matmul. `capability` overrides the device's (for tests); `what`
    asks for fp8 and `instead` is the way out the message suggests."""
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise QuantizationError(f"{what} runs on CUDA or the CPU, not {device}")
    cap = capability or torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else str(device)
        raise QuantizationError(
            f"{what} needs fp8 matmul (CUDA compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+: Ada, Hopper or newer); "
            f"{name} is {cap[0]}.{cap[1]}; {instead}")


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


def tp_share(t: torch.Tensor, dim: int | None, tp: TPGroup) -> torch.Tensor:
    """This rank's share of a whole checkpoint tensor cut along `dim` (None: all of it); a
    tensor the group does not divide comes back whole, for the caller's shape check."""
    if dim is None or tp.size == 1 or t.shape[dim] % tp.size:
        return t
    return t.chunk(tp.size, dim)[tp.rank]


def check_shape(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.shape != want.shape:
        raise ValueError(f"checkpoint shape {tuple(got.shape)}, model expects {tuple(want.shape)}")


class Fp8Weights(nn.Module):
    """`nn.Linear`'s interface and parameter names with an fp8 `weight` `[out, in]`, a float32
    scale buffer (named `scale_name`, of `scale_shape`), and a bias in the model's dtype.
    Subclasses define the product and the scales' layout."""

    scale_name = "weight_scale"

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 scale_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8),
                                   requires_grad=False)
        self.register_buffer(self.scale_name, torch.ones(scale_shape, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    @property
    def scales(self) -> torch.Tensor:
        return getattr(self, self.scale_name)

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        """x `[T, in]` (`[T, 2 * in]` with `gate_act`: see `fp8_linear`) -> `[T, out]`."""
        return self.product(x, self.bias, gate_act)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None,
                gate_act: GateAct | None) -> torch.Tensor:
        raise NotImplementedError

    def load_fp8_rows(self, start: int, q: torch.Tensor) -> None:
        """Copy a checkpoint's fp8 rows `q` `[rows, in]` (on any device, a host tensor staged
        by the copy itself) into output rows start..start+rows."""
        self.weight.narrow(0, start, q.shape[0]).copy_(q, non_blocking=True)

    def restore_storage(self) -> None:
        """`Module.to(dtype)` casts every floating tensor, fp8 and the scales included: give
        them back their storage dtypes (on the meta device, before memory is allocated)."""
        self.weight = nn.Parameter(self.weight.to(FP8), requires_grad=False)
        setattr(self, self.scale_name, self.scales.float())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, fp8")


class Fp8Linear(Fp8Weights):
    """fp8 weights with one float32 scale per output channel (`weight_scale` `[out]`), filled
    from 16-bit rows quantized at load (`load_rows`) or from a checkpoint's fp8 rows and
    per-channel or per-tensor scales (`load_fp8_rows`, `load_scale`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias, (out_features,))

    def product(self, x: torch.Tensor, bias: torch.Tensor | None,
                gate_act: GateAct | None) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, bias, gate_act)  # [T, out]

    def load_rows(self, start: int, w: torch.Tensor) -> None:
        """Quantize 16-bit rows `w` `[rows, in]` into output channels start..start+rows."""
        q, scale = quantize_rows(w.to(self.weight.device))
        self.weight.narrow(0, start, w.shape[0]).copy_(q)
        self.weight_scale.narrow(0, start, w.shape[0]).copy_(scale)

    def load_scale(self, start: int, rows: int, scale: torch.Tensor, dim: int | None,
                   tp: TPGroup) -> None:
        """Copy a whole checkpoint scale of output rows start..start+rows: one a row (`[out]`
        or `[out, 1]`, cut like the weight when TP cuts rows: `dim` 0) or one for the tensor
        (repeated: exact). Raises ValueError for a shape that fits neither."""
        s = scale.float().reshape(-1)  # [out] or [1]
        s = s.expand(rows) if s.numel() == 1 else tp_share(s, dim if dim == 0 else None, tp)
        dest = self.weight_scale.narrow(0, start, rows)
        check_shape(s, dest)
        dest.copy_(s)
