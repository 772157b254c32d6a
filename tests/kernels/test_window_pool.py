"""`window_pool` (the compression windows' pooling) against its torch reference on odd
shapes under the interpreter, and the reference against the pooling written out."""

import math

import pytest
import torch

from kernels.sparse.window_pool import window_pool, window_pool_ref
from tests.kernels.cases import DEVICE, DTYPES, randn

POOL_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def make_inputs(T, cells, rate, series, d, E, dtype, seed=0):
    """Sources as column ranges of wider rows (kv and gate side by side, as a ring keeps
    them apart), lists mixing new rows, kept cells and -1, one entry with none."""
    gen = torch.Generator().manual_seed(seed)
    new = randn(T, 2, series, d + 3, dtype=dtype, gen=gen)[..., 1 : 1 + d]  # [T, 2, s, d]
    kept = randn(cells, 2, series, d + 3, dtype=dtype, gen=gen)[..., :d]
    span = series * rate
    index = torch.randint(0, T + cells, (E, span), generator=gen)
    index[torch.rand(E, span, generator=gen) < 0.25] = -1
    index[E // 2 : E // 2 + 1] = -1
    series_of = torch.arange(span) // rate  # [S]: a CSA window's two series
    bias = randn(rate, series, d, gen=gen)
    return (new[:, 0], new[:, 1], kept[:, 0], kept[:, 1], index.to(DEVICE),
            series_of.to(DEVICE), bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, cells, rate, series, d, E", [
    (7, 16, 4, 2, 48, 5),  # CSA: two series, a partial channel block
    (1, 9, 3, 1, 130, 3),  # HCA: two whole blocks and a partial one
    (40, 25, 20, 2, 16, 11),  # 40 inputs an entry: two whole and a partial input tile
])  # fmt: skip
def test_matches_reference(T, cells, rate, series, d, E, dtype):
    args = make_inputs(T, cells, rate, series, d, E, dtype, seed=E)
    out = window_pool(*args)
    torch.testing.assert_close(out, window_pool_ref(*args), atol=POOL_TOL[dtype],
                               rtol=POOL_TOL[dtype])
    assert (out[E // 2] == 0).all()


def test_reference_is_the_pooling():
    # one entry of a CSA window of 2 tokens: inputs new row 1 (series 0), kept cell 0
    # (series 1, index T + 0), and none; per channel softmax(gate + bias) weights the kv
    T = 2
    new_kv = torch.arange(2 * 2 * 3.0).view(T, 2, 3)
    new_gate = torch.zeros(T, 2, 3)
    new_gate[1, 0] = torch.tensor([0.0, 1.0, -2.0])
    kept_kv = -torch.ones(1, 2, 3)
    kept_gate = torch.full((1, 2, 3), 0.5)
    bias = torch.zeros(2, 2, 3)
    bias[1, 1] = 0.25  # input 3 (row 3 % 2 = 1) of series 1
    index = torch.tensor([[1, -1, -1, T]])
    series = torch.tensor([0, 0, 1, 1])
    out = window_pool_ref(new_kv, new_gate, kept_kv, kept_gate, index, series, bias)
    for c, g in enumerate([0.0, 1.0, -2.0]):
        w_new, w_kept = math.exp(g), math.exp(0.75)
        want = (w_new * new_kv[1, 0, c].item() - w_kept) / (w_new + w_kept)
        assert out[0, c].item() == pytest.approx(want, rel=1e-6)


def test_empty_and_bad_inputs():
    args = make_inputs(3, 4, 2, 2, 16, 0, torch.float32)
    assert window_pool(*args).shape == (0, 16)
    new_kv, new_gate, kept_kv, kept_gate, index, series, bias = make_inputs(
        3, 4, 2, 2, 16, 2, torch.float32)
    with pytest.raises(AssertionError, match="index must be int32/int64"):
        window_pool(new_kv, new_gate, kept_kv, kept_gate, index.float(), series, bias)
    with pytest.raises(AssertionError, match=r"series must be \[4\]"):
        window_pool(new_kv, new_gate, kept_kv, kept_gate, index, series[:3], bias)
    with pytest.raises(AssertionError, match=r"kept_kv must be \[rows, series, 16\]"):
        window_pool(new_kv, new_gate, kept_kv[..., :8], kept_gate, index, series, bias)
