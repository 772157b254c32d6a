import pytest
import torch

from kernels.gemm.fp8_quant import per_token_fp8, per_token_fp8_ref
from tests.kernels.cases import DEVICE, DTYPES, randn

SHAPES = [(1, 16), (5, 77), (3, 5000)]  # 5000: more than one block per row


def inputs(shape, dtype):
    x = randn(*shape, dtype=dtype, gen=torch.Generator().manual_seed(0)) * 3  # [T, K]
    x[-1] = 0  # an all-zero row gets scale 1 and zeros
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scales_match_reference(dtype, shape):
    x = inputs(shape, dtype)
    _, scale = per_token_fp8(x)
    _, want = per_token_fp8_ref(x)
    assert scale.shape == (shape[0], 1) and scale.dtype == torch.float32
    torch.testing.assert_close(scale, want, rtol=1e-6, atol=0)
    assert scale[-1].item() == 1.0


# The Triton interpreter rounds fp32 -> e4m3 without carrying into the exponent (127.8 -> 64),
# so the quantized values are compared on the GPU only.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values_match_reference(dtype, shape):
    x = inputs(shape, dtype)
    q, _ = per_token_fp8(x)
    want, _ = per_token_fp8_ref(x)
    assert q.dtype == torch.float8_e4m3fn
    torch.testing.assert_close(q.float(), want.float(), rtol=0, atol=0)


def test_strided_rows_and_empty_input():
    x = inputs((4, 64), torch.float32)[:, :48]  # rows 64 apart, 48 wide
    _, scale = per_token_fp8(x)
    torch.testing.assert_close(scale, per_token_fp8_ref(x)[1], rtol=1e-6, atol=0)
    q, scale = per_token_fp8(torch.empty(0, 32, device=DEVICE))
    assert q.shape == (0, 32) and scale.shape == (0, 1)
