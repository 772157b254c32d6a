"""The 16-bit linears' product: cuBLAS unless the measured table says the skinny kernel wins."""

import pytest
import torch
from torch import nn

from kernels.activation import silu_and_mul_ref
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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("rows", [1, 4, 5])
def test_gated_input_is_the_activation_then_the_product(device, rows):
    """A down projection given `[gate | up]` and the activation computes down(silu(gate) * up):
    on CUDA for one row inside the kernel's loads (the activation is never called), else the
    activation first."""
    gen = torch.Generator(device=device).manual_seed(rows)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = torch.randn(96, 136, device=device, generator=gen).to(dtype)  # [out, in]
    b = torch.randn(96, device=device, generator=gen).to(dtype)
    h = torch.randn(rows, 272, device=device, generator=gen).to(dtype)  # [T, 2 * in]
    calls = []

    def act(x):
        calls.append(x.shape[0])
        return silu_and_mul_ref(x)

    got = dl.dense_linear(h, w, b, gate_act=act)
    want = dl.dense_linear(silu_and_mul_ref(h), w, b)
    assert got.shape == (rows, 96) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=2e-2)
    assert calls == ([] if device == "cuda" and rows == 1 else [rows])
