import pytest
import torch

from kernels.norm_rope.activation import silu_and_mul, silu_and_mul_ref
from tests.kernels.cases import DEVICE, DTYPES, ELEMENTWISE_TOL, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (5, 2 * 1536), (3, 2 * 77)], ids=str)
def test_matches_reference(dtype, shape):
    x = randn(*shape, dtype=dtype, gen=torch.Generator().manual_seed(0)) * 6  # [T, 2I]
    tol = ELEMENTWISE_TOL[dtype]
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), atol=tol, rtol=tol)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy
def test_extreme_gates():
    x = torch.tensor([[-1e4, 0.0, 30.0, 1.0, 2.0, 2.0]], device=DEVICE)  # gates, then ups
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x))


def test_rejects_odd_width():
    with pytest.raises(AssertionError, match=r"\[T, 2I\]"):
        silu_and_mul(torch.randn(2, 7))
