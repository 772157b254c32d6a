"""The parameter matrices of the MLA kernel tests (decode and extend alike)."""

import pytest
import torch

from tests.kernels.cases import DTYPES

MLA_DIMS = [(32, 16), (24, 8), (64, 32)]  # (Dl, Dr): power-of-two, odd, and wider latents


def _stacked(*marks):
    """A decorator applying `marks` as if written in this order above the test."""

    def apply(test):
        for mark in reversed(marks):  # the lowest decorator applies first
            test = mark(test)
        return test

    return apply


def mla_cases(heads: list[int]):
    """Every dtype and latent width of `MLA_DIMS` at each of `heads`, on token and 16-token
    pages (`dtype, dims, heads, page_size`)."""
    return _stacked(
        pytest.mark.parametrize("dtype", DTYPES),
        pytest.mark.parametrize("dims", MLA_DIMS, ids=str),
        pytest.mark.parametrize("heads", heads),
        pytest.mark.parametrize("page_size", [1, 16]),
    )


# The GPU matrix at DeepSeek-V2/V3 shapes: fp16 and bf16, 16 and 128 heads, token and 16-token
# pages, a 16-bit and an fp8 pool (`dtype, heads, page_size, pool_dtype`).
deepseek_gpu_cases = _stacked(
    pytest.mark.gpu,
    pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"]),
    pytest.mark.parametrize("heads", [16, 128]),
    pytest.mark.parametrize(
        "page_size, pool_dtype",
        [(1, None), (16, None), (16, torch.float8_e4m3fn)],
        ids=["token", "paged16", "paged16-fp8"],
    ),
)
