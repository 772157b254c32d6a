"""Block-scaled fp8 weights, as block-quantized checkpoints ship them: float8_e4m3fn `weight`
`[out, in]` and one float32 `weight_scale_inv` per (bn, bk) block, `[ceil(out / bn),
ceil(in / bk)]`, w = q * scale_inv of its block (the last blocks partial when a dim is not a
multiple).

The product follows `fp8_linear`'s split: up to `WEIGHT_ONLY_ROWS` tokens run weight-only
(16-bit activations, the weight widened in registers); larger batches quantize the activations
per token and bk-column group, so that each K step of the block GEMM meets one activation scale
per row and one weight scale per block (`kernels.gemm.block_fp8`, on CUDA). A K that is not a
multiple of bk leaves a partial last group: such layers run weight-only at every batch size.
Off CUDA the same numbers are computed by dequantizing and multiplying in float32 (the
reference): correct, not fast.

Fused layers (Q/K/V, gate/up) hold their parts' scale rows one after the other, so each part
must start on a block row; a TP shard must hold whole blocks (`check_part`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.gemm.block_fp8 import block_fp8_gemm, dequantize_blocks
from kernels.gemm.fp8_quant import per_token_group_fp8, per_token_group_fp8_ref
from runtime.worker.ops import GateAct
from runtime.worker.quant.fp8_linear import (
    WEIGHT_ONLY_ROWS,
    Fp8Weights,
    QuantizationError,
    check_shape,
    tp_share,
)
from runtime.worker.tp import TPGroup


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quantizes_activations(x: torch.Tensor, block: tuple[int, int]) -> bool:
    """Whether x `[T, in]` is quantized per token and group: more than WEIGHT_ONLY_ROWS
    tokens, and whole groups."""
    return x.shape[0] > WEIGHT_ONLY_ROWS and x.shape[1] % block[1] == 0


def block_fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                         block: tuple[int, int], bias: torch.Tensor | None = None
                         ) -> torch.Tensor:
    """`block_fp8_linear` in float32: the weight dequantized, and x quantized per token and
    group where the GPU path quantizes it, then dequantized. x `[T, in]` -> `[T, out]`."""
    xf = x.float()
    if quantizes_activations(x, block):
        xq, xs = per_token_group_fp8_ref(x, block[1])  # [T, in] fp8, [T, in / bk] f32
        xf = dequantize_blocks(xq, xs, (1, block[1]))
    y = F.linear(xf, dequantize_blocks(weight, scale_inv, block))  # [T, out] f32
    return (y if bias is None else y + bias.float()).to(x.dtype)


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                     block: tuple[int, int], bias: torch.Tensor | None = None,
                     gate_act: GateAct | None = None) -> torch.Tensor:
    """x `[T, in]` times the block-scaled fp8 `weight` `[out, in]` (+ bias) -> `[T, out]` in
    x's dtype. With `gate_act` (the MLP's silu-and-mul) x is `[T, 2 * in]` and the product is
    taken of gate_act(x), computed first. No host sync."""
    if gate_act is not None:
        x = gate_act(x)  # [T, in]
    if not x.is_cuda:
        return block_fp8_linear_ref(x, weight, scale_inv, block, bias)
    if quantizes_activations(x, block):
        xq, xs = per_token_group_fp8(x, block[1])  # [T, in] fp8, [T, in / bk] f32
        return block_fp8_gemm(xq, xs, weight, scale_inv, block, bias, out_dtype=x.dtype)
    return block_fp8_gemm(x.contiguous(), None, weight, scale_inv, block, bias)  # [T, out]


class BlockFp8Linear(Fp8Weights):
    """fp8 weights with block scales `weight_scale_inv` `[ceil(out / bn), ceil(in / bk)]`,
    filled from a checkpoint's fp8 rows (`load_fp8_rows`) and block scales (`load_scale`)."""

    scale_name = "weight_scale_inv"

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 block: tuple[int, int]) -> None:
        super().__init__(in_features, out_features, bias,
                         (cdiv(out_features, block[0]), cdiv(in_features, block[1])))
        self.block = block

    def product(self, x: torch.Tensor, bias: torch.Tensor | None,
                gate_act: GateAct | None) -> torch.Tensor:
        return block_fp8_linear(x, self.weight, self.weight_scale_inv, self.block, bias,
                                gate_act)  # [T, out]

    def check_part(self, start: int, rows: int, dim: int | None, tp: TPGroup) -> None:
        """Raise QuantizationError unless a checkpoint tensor of `rows` (this rank's) loaded
        at output row `start`, cut along `dim` under TP, keeps whole scale blocks: a part
        starts on a block row, only the layer's last part may end inside one, and a TP share
        holds whole blocks."""
        bn, bk = self.block
        if tp.size > 1 and dim == 0 and rows % bn:
            raise QuantizationError(
                f"this rank's {rows} rows (of {rows * tp.size}, TP {tp.size}) are not "
                f"whole {bn}-row scale blocks; serve it with a TP size that divides them")
        if tp.size > 1 and dim == 1 and self.in_features % bk:
            raise QuantizationError(
                f"this rank's {self.in_features} input columns (TP {tp.size}) are not whole "
                f"{bk}-column scale blocks; serve it with a TP size that divides them")
        if start % bn or (rows % bn and start + rows != self.out_features):
            raise QuantizationError(
                f"rows {start}..{start + rows} of a fused layer do not fall on its "
                f"{bn}-row scale blocks")

    def load_scale(self, start: int, rows: int, scale: torch.Tensor, dim: int | None,
                   tp: TPGroup) -> None:
        """Copy a whole checkpoint block-scale tensor of output rows start..start+rows, cut
        along `dim` like the weight (after `check_part`, TP shares are whole blocks). Raises
        ValueError for a shape that does not fit."""
        s = tp_share(scale.float(), dim, tp)
        dest = self.weight_scale_inv.narrow(0, start // self.block[0],
                                            cdiv(rows, self.block[0]))
        check_shape(s, dest)
        dest.copy_(s)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block={self.block}"
