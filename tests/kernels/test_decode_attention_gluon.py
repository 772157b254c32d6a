"""The Gluon stage 1 (`kernels.attention.decode_gluon`) over fp8 and int8 pools against the
reference: MHA and GQA groups up to 16, token and paged layouts, splits, partial and empty
tiles, each tile size and ring depth; every code coming back exactly (the register-level
operand build); and which stage 1 `default_quant_config` picks. GPU only but one test: Gluon
has no interpreter."""

import pytest
import torch

from kernels.attention.decode import decode_attention
from kernels.attention.decode_config import (
    GLUON_CONFIG,
    QUANT_GQA_CONFIG,
    QUANT_MHA_CONFIG,
    QUANT_PAGED_GQA_CONFIG,
    DecodeConfig,
    default_quant_config,
)
from kernels.kv.store import dequantize_ref
from tests.kernels.test_decode_attention import check, make_inputs

GPU = pytest.mark.gpu
LENS = [1, 37, 150, 700, 0, 64, 129]  # one key; partial tiles; an empty sequence; whole tiles
POOLS = [torch.float8_e4m3fn, torch.int8]


@GPU
@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(32, 32, 128), (32, 8, 128), (16, 1, 128), (6, 2, 128)],
                         ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_default_matches_reference(pool, dtype, heads, page_size, num_splits):
    args, scales = make_inputs(LENS, heads, page_size, dtype, pool, seed=sum(heads))
    check(args, scales, dtype, config=GLUON_CONFIG, num_splits=num_splits)


@GPU
@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("heads", [(32, 32, 128), (32, 8, 128)], ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("block_n", [64, 128])
def test_two_scale_tensors_match_reference(pool, heads, page_size, block_n):
    # K's and V's scales as two tensors (not one pair tensor): a load each, by their strides.
    args, scales = make_inputs(LENS, heads, page_size, torch.bfloat16, pool, seed=block_n,
                               paired=False)
    assert scales["k_scale"].is_contiguous()
    check(args, scales, torch.bfloat16, num_splits=3,
          config=DecodeConfig(gluon=True, block_n=block_n, num_stages=2))


@GPU
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(32, 32, 128), (32, 8, 128), (16, 1, 128)], ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("block_n, num_stages", [(64, 2), (64, 3), (128, 2)])
def test_unscaled_fp8_matches_reference(dtype, heads, page_size, block_n, num_stages):
    # No scale tensor: the kernel reads only the codes, which are the values.
    args, scales = make_inputs(LENS, heads, page_size, dtype, torch.float8_e4m3fn,
                               seed=block_n + num_stages, scaled=False)
    for num_splits in (None, 1, 3):
        check(args, scales, dtype, num_splits=num_splits,
              config=DecodeConfig(gluon=True, block_n=block_n, num_stages=num_stages))


@GPU
@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("block_n, num_stages", [(64, 3), (64, 4), (128, 2), (128, 3)])
@pytest.mark.parametrize("heads", [(32, 8, 128), (6, 2, 128)], ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
def test_tile_and_ring_sizes_match_reference(pool, block_n, num_stages, heads, page_size):
    args, scales = make_inputs(LENS, heads, page_size, torch.bfloat16, pool,
                               seed=block_n + num_stages)
    check(args, scales, torch.bfloat16, num_splits=3,
          config=DecodeConfig(gluon=True, block_n=block_n, num_stages=num_stages))


@GPU
@pytest.mark.parametrize("pool", POOLS, ids=str)
def test_every_code_widens_exactly(pool):
    codes = torch.arange(256, dtype=torch.uint8)
    if pool == torch.float8_e4m3fn:
        codes[(codes & 0x7F) == 0x7F] = 0  # the two NaNs
    v_buf = torch.zeros(3, 1, 128, dtype=torch.uint8)
    v_buf[1:, 0] = codes.view(2, 128)
    v_buf = v_buf.view(pool).cuda()
    scale = torch.full((3, 1), 0.375, device="cuda")
    q = torch.randn(2, 2, 128, device="cuda").half()
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    indices = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
    lens = torch.ones(2, dtype=torch.int32, device="cuda")
    out = decode_attention(q, v_buf, v_buf, indptr, indices, lens, 1, 128**-0.5,
                           k_scale=scale, v_scale=scale, config=GLUON_CONFIG)
    want = dequantize_ref(v_buf[1:], scale[1:]).expand(2, 2, 128).half()
    torch.testing.assert_close(out, want, atol=0, rtol=0)


def kv_buf(dtype, heads=8, head_dim=128, device="cpu"):
    return torch.zeros(4, heads, head_dim, device=device).to(dtype)


def test_cpu_takes_the_triton_kernel():
    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    assert default_quant_config(q, kv_buf(torch.float8_e4m3fn, 32), 1) == QUANT_MHA_CONFIG
    assert default_quant_config(q, kv_buf(torch.float8_e4m3fn), 1) == QUANT_GQA_CONFIG
    assert default_quant_config(q, kv_buf(torch.float8_e4m3fn), 16) == QUANT_PAGED_GQA_CONFIG
    assert default_quant_config(q, kv_buf(torch.int8), 1) == QUANT_GQA_CONFIG


@GPU
def test_gpu_takes_gluon_where_it_applies():  # an sm_89+ GPU
    fp8, cuda = torch.float8_e4m3fn, "cuda"
    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16, device=cuda)
    assert default_quant_config(q, kv_buf(fp8, device=cuda), 16) == GLUON_CONFIG
    assert default_quant_config(q, kv_buf(fp8, 32, device=cuda), 16) == GLUON_CONFIG
    assert default_quant_config(q, kv_buf(torch.int8, device=cuda), 16) == GLUON_CONFIG
    assert default_quant_config(q.half(), kv_buf(fp8, 32, device=cuda), 1) == GLUON_CONFIG
    assert default_quant_config(q, kv_buf(torch.int8, device=cuda), 1) == GLUON_CONFIG
    assert default_quant_config(q, kv_buf(fp8, device=cuda), 1) == GLUON_CONFIG
    assert default_quant_config(q, kv_buf(fp8, 1, device=cuda), 1) == QUANT_GQA_CONFIG  # group 32
    q64 = torch.zeros(2, 32, 64, dtype=torch.bfloat16, device=cuda)
    assert default_quant_config(q64, kv_buf(fp8, 32, 64, cuda), 1) == QUANT_MHA_CONFIG
