"""The 16-bit linears' product: cuBLAS unless the measured table says the skinny kernel wins."""

import pytest
import torch
from torch import nn

from runtime.worker.models import dense_linear as dl


def test_dense_linear_is_nn_linear():
    torch.manual_seed(0)
    layer, plain = dl.DenseLinear(24, 10, bias=True), nn.Linear(24, 10, bias=True)
    plain.load_state_dict(layer.state_dict())  # same parameter names
    x = torch.randn(3, 24)
    torch.testing.assert_close(layer(x), plain(x), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 16, 17])
def test_kernel_where_it_wins_cublas_elsewhere(monkeypatch, rows):
    monkeypatch.setattr(dl, "use_kernel", lambda fp8, m, n, k: True)
    gen = torch.Generator(device="cuda").manual_seed(rows)
    w = torch.randn(96, 272, device="cuda", generator=gen).bfloat16()  # [out, in]
    b = torch.randn(96, device="cuda", generator=gen).bfloat16()
    x = torch.randn(rows, 272, device="cuda", generator=gen).bfloat16()  # [T, in]
    want = (x.float() @ w.float().T + b.float())  # [T, out]
    got = dl.dense_linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    torch.testing.assert_close(got.float(), want, rtol=1.6e-2, atol=2e-2)
