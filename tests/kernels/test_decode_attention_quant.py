"""The quantized decode kernel's load paths: 32-bit words widened by bit arithmetic, bytes
widened by casts, and the register prefetch of the next tile, each against the reference,
over pools with per-(slot, head) scales and over an unscaled fp8 pool."""

import pytest
import torch

from kernels.attention.decode import DecodeConfig, decode_attention
from kernels.kv.store import dequantize_ref
from tests.kernels.cases import DEVICE, DTYPES, randn
from tests.kernels.test_decode_attention import check, make_inputs

POOLS = [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")]
LOAD_PATHS = [
    DecodeConfig(words=False),
    DecodeConfig(block_n=32, words=True),
    DecodeConfig(block_n=16, num_stages=1, prefetch=True),
    DecodeConfig(block_n=64, num_stages=1, words=True, prefetch=True),
]


@pytest.mark.parametrize("config", LOAD_PATHS, ids=str)
@pytest.mark.parametrize("pool_dtype", POOLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_load_paths_match_reference(dtype, pool_dtype, config):
    # GQA 3 and 8, head dims under a power of two (48, 80) and one not a multiple of 4 (30:
    # words fall back to bytes), token and paged layouts, partial last tiles.
    for page_size, heads in ((1, (9, 3, 48)), (16, (8, 1, 80)), (16, (4, 2, 30))):
        args, scales = make_inputs([1, 37, 150], heads, page_size, dtype, pool_dtype, seed=10)
        check(args, scales, dtype, config=config)


@pytest.mark.parametrize("pool_dtype", POOLS)
def test_two_scale_tensors_match_reference(pool_dtype):
    # K's and V's scales as two contiguous tensors, not the halves of one pair tensor.
    args, scales = make_inputs([1, 37, 150], (9, 3, 48), 1, torch.float32, pool_dtype, seed=13,
                               paired=False)
    assert scales["k_scale"].is_contiguous()
    check(args, scales, torch.float32, config=LOAD_PATHS[0])


@pytest.mark.parametrize("config", LOAD_PATHS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unscaled_fp8_matches_reference(dtype, config):
    # No scale tensor at all: the codes are the values (a per-tensor scale of 1).
    for page_size, heads in ((1, (9, 3, 48)), (16, (4, 4, 80))):
        args, scales = make_inputs([1, 37, 150], heads, page_size, dtype, torch.float8_e4m3fn,
                                   seed=12, scaled=False)
        assert scales == {}
        check(args, scales, dtype, config=config)


@pytest.mark.parametrize("config", LOAD_PATHS, ids=str)
@pytest.mark.parametrize("pool_dtype", POOLS)
def test_every_code_widens_exactly(pool_dtype, config):
    # One key per sequence: the output is that key's value row, so each of the 256 codes (the
    # two e4m3 NaNs aside) must come back as exactly code * scale.
    codes = torch.arange(256, dtype=torch.uint8)
    if pool_dtype == torch.float8_e4m3fn:
        codes[(codes & 0x7F) == 0x7F] = 0
    v_buf = torch.zeros(3, 1, 128, dtype=torch.uint8)  # [S, Hkv, D]; slot 0 unused
    v_buf[1:, 0] = codes.view(2, 128)
    v_buf = v_buf.view(pool_dtype).to(DEVICE)
    scale = torch.full((3, 1), 0.375, device=DEVICE)  # [S, Hkv]
    q = randn(2, 2, 128, gen=torch.Generator().manual_seed(11))  # [B, Hq, D]
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    indices = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    out = decode_attention(q, v_buf, v_buf, indptr, indices, lens, 1, 128**-0.5,
                           k_scale=scale, v_scale=scale, config=config)  # fmt: skip
    want = dequantize_ref(v_buf[1:], scale[1:]).expand(2, 2, 128)  # [B, Hq, D]
    torch.testing.assert_close(out, want, atol=0, rtol=0)
