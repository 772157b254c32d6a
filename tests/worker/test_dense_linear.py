"""The 16-bit linears' product: cuBLAS unless the measured table says the skinny kernel wins."""

import pytest
import torch
from torch import nn

from kernels.norm_rope.activation import silu_and_mul_ref
from runtime.worker.models import dense_linear as dl
from runtime.worker.models.parallel import RowParallelLinear
from runtime.worker.tp import TPGroup


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
    assert not dl.fuses_gate(h[:1].cpu(), w.cpu())


def test_fused_route_runs_the_gated_kernel(monkeypatch):
    """Where `fuses_gate` says so, the product runs the gated kernel (here under the Triton
    interpreter) and the activation is never called; the result is the activation's then
    the product's."""
    monkeypatch.setattr(dl, "fuses_gate", lambda x, w: True)
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(40, 72, generator=gen), torch.randn(40, generator=gen)  # [out, in]
    h = torch.randn(1, 144, generator=gen) * 3  # [1, 2 * in]
    got = dl.dense_linear(h, w, b, gate_act=lambda x: pytest.fail("activation called"))
    torch.testing.assert_close(got, silu_and_mul_ref(h) @ w.T + b, rtol=1e-4, atol=1e-4)


class _SumOnReturn(TPGroup):
    """A group of two whose all-reduce leaves each rank's partial sum (the test adds them)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("fused", [False, True], ids=["activation-first", "fused"])
def test_row_parallel_shards_take_their_gate_and_up_halves(monkeypatch, fused):
    """Under TP 2 each rank's down projection gets its `[gate_r | up_r]` columns of the MLP's
    gate/up output and its columns of the weight; the ranks' sums make the whole product,
    the bias added once."""
    monkeypatch.setattr(dl, "fuses_gate", lambda x, w: fused)
    gen = torch.Generator().manual_seed(6)
    inter, out = 48, 40
    w, b = torch.randn(out, inter, generator=gen), torch.randn(out, generator=gen)
    gate, up = torch.randn(1, inter, generator=gen), torch.randn(1, inter, generator=gen)
    want = (torch.nn.functional.silu(gate) * up) @ w.T + b  # [1, out]
    half = inter // 2
    parts = []
    for r in range(2):
        layer = RowParallelLinear(half, out, bias=True, tp=_SumOnReturn(r, 2))
        cols = slice(r * half, (r + 1) * half)
        layer.weight.data.copy_(w[:, cols])
        layer.bias.data.copy_(b)
        h = torch.cat([gate[:, cols], up[:, cols]], dim=1)  # [1, 2 * half], this rank's
        parts.append(layer(h, gate_act=silu_and_mul_ref) - b)
    torch.testing.assert_close(parts[0] + parts[1] + b, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_only_one_16_bit_row_fuses():
    h = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 32, device="cuda", dtype=torch.bfloat16)
    assert dl.fuses_gate(h, w)
    assert not dl.fuses_gate(torch.cat([h, h]), w)  # two rows
    assert not dl.fuses_gate(h, w.to(torch.float8_e4m3fn))  # fp8 weight
    assert not dl.fuses_gate(h.float(), w.float())  # 32-bit: not measured
