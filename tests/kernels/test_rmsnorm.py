import pytest
import torch

from kernels.norm_rope.rmsnorm import rmsnorm, rmsnorm_ref
from tests.kernels.cases import DEVICE, DTYPES, ELEMENTWISE_TOL, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (7, 33), (5, 1000)], ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_reference(dtype, shape, with_residual):
    gen = torch.Generator().manual_seed(0)
    x = randn(*shape, dtype=dtype, gen=gen) * 4  # [T, hidden]
    weight = randn(shape[1], dtype=dtype, gen=gen)  # [hidden]
    residual = randn(*shape, dtype=dtype, gen=gen) if with_residual else None
    x_before = x.clone()
    out = rmsnorm(x, weight, 1e-6, residual)
    ref = rmsnorm_ref(x, weight, 1e-6, residual)
    tol = ELEMENTWISE_TOL[dtype]
    if with_residual:
        torch.testing.assert_close(out[1], ref[1], atol=0, rtol=0)  # h = x + residual, exact
        out, ref = out[0], ref[0]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    assert torch.equal(x, x_before)  # returns new tensors, inputs untouched


def test_strided_rows():
    x = randn(6, 96, gen=torch.Generator().manual_seed(1))[:, :80]  # [T, 80] view
    weight = torch.rand(80, device=DEVICE)
    torch.testing.assert_close(rmsnorm(x, weight, 1e-5), rmsnorm_ref(x, weight, 1e-5))


def test_rejects_bad_weight():
    with pytest.raises(AssertionError, match="weight"):
        rmsnorm(torch.randn(2, 8), torch.ones(9), 1e-6)
