"""The block-scaled fp8 GEMM against its torch reference, on odd shapes (partial last
blocks in N and K, M across the row tiles), in both modes: weight-only (16/32-bit x) and
w8a8 (fp8 x with per-token group scales); and the per-token group quantization's scales.

The operands are quantized in torch: the Triton interpreter rounds fp32 -> e4m3 casts without
carrying into the exponent (test_fp8_quant), but it loads and multiplies fp8 exactly, so both
modes run on the CPU."""

import pytest
import torch

from kernels.gemm.block_fp8 import block_fp8_gemm, block_fp8_gemm_ref
from kernels.gemm.fp8_quant import per_token_group_fp8, per_token_group_fp8_ref
from tests.kernels.cases import DEVICE, DTYPES, randn

FP8 = torch.float8_e4m3fn
# (M, N, K, block): a single row; partial blocks in N and K; a K of one partial block; rows
# past one tile; and blocks of another size (BLOCK_N 64 spans two 32-row scale blocks)
SHAPES = [(1, 100, 200, (128, 128)), (5, 257, 384, (128, 128)), (33, 130, 96, (128, 128)),
          (70, 70, 256, (128, 128)), (17, 96, 100, (32, 64))]


def tolerance(dtype: torch.dtype) -> float:
    """Relative error bound: the interpreter sums fp32 exactly as the reference does; fp16
    output rounds each element (2^-11 relative); on a GPU tl.dot accumulates in its own
    order (and fp32 goes through TF32)."""
    if DEVICE == "cpu":
        return 1e-6 if dtype == torch.float32 else 1e-3
    return 1e-2


def operands(m, n, k, block, gen):
    bn, bk = block
    w = randn(n, k, gen=gen).to(FP8)  # [N, K]
    w_scale = (torch.rand(-(-n // bn), -(-k // bk), generator=gen) + 0.1).to(DEVICE)
    bias = randn(n, gen=gen)
    return w, w_scale, bias


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_weight_only_matches_reference(shape, dtype):
    m, n, k, block = shape
    gen = torch.Generator().manual_seed(m + n)
    w, w_scale, bias = operands(m, n, k, block, gen)
    x = randn(m, k, dtype=dtype, gen=gen)
    got = block_fp8_gemm(x, None, w, w_scale, block, bias.to(dtype))
    want = block_fp8_gemm_ref(x, None, w, w_scale, block, bias.to(dtype))
    assert got.dtype == dtype and got.shape == (m, n)
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < tolerance(dtype), err


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_w8a8_matches_reference(shape, out_dtype):
    m, n, k, block = shape
    gen = torch.Generator().manual_seed(m * n)
    w, w_scale, _ = operands(m, n, k, block, gen)
    x = randn(m, k, gen=gen).to(FP8)  # [M, K] already quantized
    x_scale = (torch.rand(m, -(-k // block[1]), generator=gen) + 0.5).to(DEVICE)
    got = block_fp8_gemm(x, x_scale, w, w_scale, block, out_dtype=out_dtype)
    want = block_fp8_gemm_ref(x, x_scale, w, w_scale, block, out_dtype=out_dtype)
    assert got.dtype == out_dtype and got.shape == (m, n)
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < tolerance(out_dtype), err


def test_no_rows():
    w, w_scale, _ = operands(0, 40, 64, (128, 128), torch.Generator().manual_seed(0))
    x = torch.empty(0, 64, device=DEVICE)
    assert block_fp8_gemm(x, None, w, w_scale, (128, 128)).shape == (0, 40)


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_scales_match_reference(dtype):
    x = randn(6, 384, dtype=dtype, gen=torch.Generator().manual_seed(1)) * 3  # [T, K]
    x[2, 128:256] = 0  # an all-zero group gets scale 1
    q, scale = per_token_group_fp8(x, 128)
    want_q, want = per_token_group_fp8_ref(x, 128)
    assert q.shape == (6, 384) and scale.shape == (6, 3) and scale[2, 1] == 1.0
    torch.testing.assert_close(scale, want, rtol=1e-6, atol=0)
    if DEVICE == "cuda":  # the interpreter's e4m3 rounding differs (see the module doc)
        torch.testing.assert_close(q.float(), want_q.float(), rtol=0, atol=0)
