"""The skinny matmul's fused prologues: residual add + RMSNorm before the product
(`skinny_gemm_norm`) and SiLU-and-mul before it (`skinny_gemm_silu`), against the unfused
torch references, on odd shapes, both kernels, 16-bit and fp8 weights."""

import pytest
import torch

from kernels.skinny_gemm import (
    MAX_ROWS,
    fuses_norm,
    skinny_gemm_norm,
    skinny_gemm_norm_ref,
    skinny_gemm_silu,
    skinny_gemm_silu_ref,
)
from kernels.skinny_gemm_configs import SkinnyConfig, pick_config
from tests.kernels.cases import DTYPES, randn
from tests.kernels.test_skinny_gemm import CONFIGS, SHAPES, close, inputs

ONE_SLICE = [c for c in CONFIGS if c.split_k == 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8", [False, True], ids=["16bit", "fp8"])
@pytest.mark.parametrize("cfg", ONE_SLICE, ids=["plain", "rowsum-unfolded"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_norm_prologue_matches_norm_then_product(shape, cfg, fp8, dtype):
    m, n, k = shape
    x, w, scale, bias = inputs(m, n, k, dtype, fp8, seed=sum(shape))
    gen = torch.Generator().manual_seed(m * n)
    residual = randn(m, k, dtype=dtype, gen=gen)
    gamma = (1.0 + 0.5 * randn(k, gen=gen)).to(dtype)  # [K]
    y, h = skinny_gemm_norm(x, residual, gamma, 1e-6, w, scale, bias, config=cfg)
    want_y, want_h = skinny_gemm_norm_ref(x, residual, gamma, 1e-6, w, scale, bias)
    assert y.shape == (m, n) and h.shape == (m, k) and h.dtype == dtype
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)  # the residual stream, exactly
    close(y, want_y, dtype)


def test_norm_prologue_covers_every_column_block_and_row():
    """h is written once, by the first column block, for every row (M = 3 pads to 4 in the
    row-sum kernel; 16 rows in the tensor-core one); a strided x and residual."""
    for m, cfg in ((3, CONFIGS[3]), (MAX_ROWS, CONFIGS[0])):
        x, w, _, _ = inputs(m, 70, 150, torch.float32, False, seed=m)
        gen = torch.Generator().manual_seed(5)
        wide = randn(m, 2 * 150, gen=gen)
        res, gamma = wide[:, 150:], randn(150, gen=gen)
        y, h = skinny_gemm_norm(x, res, gamma, 1e-5, w, config=cfg)
        want_y, want_h = skinny_gemm_norm_ref(x, res, gamma, 1e-5, w)
        torch.testing.assert_close(h, want_h, rtol=0, atol=0)
        close(y, want_y, torch.float32)


def test_norm_prologue_refuses_a_split_of_k():
    x, w, _, _ = inputs(2, 40, 256, torch.float32, False, seed=1)
    with pytest.raises(AssertionError, match="one slice of K"):
        skinny_gemm_norm(x, x, x[0], 1e-6, w, config=SkinnyConfig(block_n=16, block_k=32,
                                                                   split_k=3))
    assert fuses_norm(True, 1, 40, 256) == (pick_config(True, 1, 40, 256).split_k == 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8", [False, True], ids=["16bit", "fp8"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["plain", "splitk", "rowsum", "rowsum-unfolded"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_silu_prologue_matches_silu_then_product(shape, cfg, fp8, dtype):
    m, n, k = shape
    _, w, scale, bias = inputs(m, n, k, dtype, fp8, seed=sum(shape) + 1)
    gate_up = randn(m, 2 * k, dtype=dtype, gen=torch.Generator().manual_seed(k))  # [M, 2K]
    y = skinny_gemm_silu(gate_up, w, scale, bias, config=cfg)
    assert y.shape == (m, n) and y.dtype == dtype
    close(y, skinny_gemm_silu_ref(gate_up, w, scale, bias), dtype)
