import pytest
import torch

from kernels.gemv import GemvConfig, gemv, gemv_ref
from tests.kernels.cases import DTYPES, randn

# float32 sums of K products in another order than the reference's
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", [(1, 37, 100), (3, 64, 576), (4, 9, 1000), (2, 130, 33)],
                         ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(dtype, m, n, k, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    x = randn(m, k, dtype=dtype, gen=gen)  # [M, K]
    w = randn(n, k, dtype=dtype, gen=gen) * 0.05  # [N, K]
    b = randn(n, dtype=dtype, gen=gen) if bias else None  # [N]
    got = gemv(x, w, b, config=GemvConfig(block_n=8, block_k=64))
    torch.testing.assert_close(got, gemv_ref(x, w, b), atol=TOL[dtype], rtol=TOL[dtype])


def test_weight_slice_with_row_stride():
    """A view of a fused weight's rows (stride between rows > K) reads the right rows."""
    gen = torch.Generator().manual_seed(0)
    fused = randn(50, 80, gen=gen)[:, :40]  # [50, 40] with row stride 80
    x = randn(2, 40, gen=gen)
    torch.testing.assert_close(gemv(x, fused), gemv_ref(x, fused), atol=1e-4, rtol=1e-4)


def test_rejects_too_many_rows():
    with pytest.raises(AssertionError, match="rows"):
        gemv(torch.randn(5, 8), torch.randn(4, 8))
