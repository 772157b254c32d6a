from functools import partial

import pytest
import torch

from kernels.attention.extend import extend_attention, launch_grid
from kernels.attention.extend_config import ExtendConfig, default_extend_config
from kernels.attention.extend_ref import extend_attention_ref
from tests.kernels.attention_cases import assert_matches_ref, kv_pools
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, page_table, randn

HEADS = [(3, 3, 64), (9, 3, 48), (8, 2, 80), (8, 1, 16)]  # (Hq, Hkv, D): GQA 1, 3, 4, 8


def make_inputs(prefix, new, heads, page_size, dtype, pool_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    Hq, Hkv, D = heads
    T = sum(new)
    kv_indptr, kv_indices, num_slots = page_table(
        [p + n for p, n in zip(prefix, new, strict=True)], page_size, gen
    )
    q = randn(T, Hq, D, dtype=dtype, gen=gen)  # [T, Hq, D]
    k_new = randn(T, Hkv, D, dtype=dtype, gen=gen)  # [T, Hkv, D]
    v_new = randn(T, Hkv, D, dtype=dtype, gen=gen)  # [T, Hkv, D]
    k_buf, v_buf, scales = kv_pools(num_slots, Hkv, D, dtype, pool_dtype, gen)
    qo_indptr = torch.tensor([0, *new], device=DEVICE).cumsum(0, dtype=torch.int32)
    prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=DEVICE)
    args = (
        q,
        k_new,
        v_new,
        k_buf,
        v_buf,
        qo_indptr,
        prefix_lens,
        kv_indptr,
        kv_indices,
        page_size,
        D**-0.5,
    )
    return args, scales


# check(args, scales, dtype, **kernel_only): the kernel against its reference
check = partial(assert_matches_ref, extend_attention, extend_attention_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_matches_reference(dtype, heads, page_size):
    # Prefixes 0 / unaligned / long, new runs of 1 token and across a 64-row block.
    args, scales = make_inputs([0, 37, 90], [70, 1, 12], heads, page_size, dtype)
    check(args, scales, dtype)


def test_empty_sequence_and_explicit_max_len():
    args, scales = make_inputs([20, 5, 0], [3, 0, 66], (4, 2, 32), 16, torch.float32, seed=1)
    check(args, scales, torch.float32, max_new_len=66)


@pytest.mark.parametrize(
    "pool_dtype",
    [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")],
)
def test_quantized_prefix(pool_dtype):
    args, scales = make_inputs([70, 17], [5, 40], (6, 2, 32), 16, torch.float32, pool_dtype)
    check(args, scales, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unscaled_fp8_prefix(dtype):
    # An fp8 pool without scales: the prefix's codes are its values.
    args, scales = make_inputs([70, 17, 0], [5, 40, 9], (6, 2, 32), 16, dtype, seed=3)
    k_buf, v_buf = args[3], args[4]
    args = (*args[:3], k_buf.to(torch.float8_e4m3fn), v_buf.to(torch.float8_e4m3fn), *args[5:])
    check(args, {}, dtype, fp8_scores=False)  # q in fp16 (a GPU's default: fp8 scores, below)


def e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] moved onto rows that quantize to e4m3 without rounding: codes whose largest
    is 448, times 2**-6 (the interpreter rounds some fp32 -> e4m3 casts down a binade)."""
    codes = (x.float() * 64).clamp(-448, 448).to(torch.float8_e4m3fn).float()  # [..., D]
    codes[..., 0] = 448.0
    return (codes * 2.0**-6).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unscaled_fp8_prefix_fp8_scores(dtype):
    # The prefix scored on fp8 tensor cores: q's rows quantized to e4m3, as the reference does.
    args, _ = make_inputs([70, 17, 0, 130], [5, 40, 9, 66], (6, 2, 32), 16, dtype, seed=4)
    q, k_new, v_new, k_buf, v_buf = args[:5]
    fp8 = torch.float8_e4m3fn
    args = (e4m3_rows(q), k_new, v_new, k_buf.to(fp8), v_buf.to(fp8), *args[5:])
    out = extend_attention(*args, fp8_scores=True)
    ref = extend_attention_ref(*args, fp8_scores=True)
    tol = ATTN_TOL[dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def test_fp8_scores_error_is_bounded():
    # What scoring the prefix from an e4m3 q costs, against the unquantized q (reference only).
    args, _ = make_inputs([300, 40], [64, 9], (8, 2, 128), 1, torch.float32, seed=5)
    fp8 = torch.float8_e4m3fn
    args = (*args[:3], args[3].to(fp8), args[4].to(fp8), *args[5:])
    err = extend_attention_ref(*args, fp8_scores=True) - extend_attention_ref(*args)
    assert 0 < err.abs().max() < 0.05


def test_fp8_scores_need_an_unscaled_fp8_pool():
    args, scales = make_inputs([20], [3], (4, 2, 32), 16, torch.float32, torch.int8)
    with pytest.raises(AssertionError, match="fp8_scores needs an fp8 pool without scales"):
        extend_attention(*args, **scales, fp8_scores=True)


@pytest.mark.parametrize(
    "config",
    [ExtendConfig(block_m=128, block_n=128, num_warps=8), ExtendConfig(block_m=16, block_n=32),
     ExtendConfig(block_m=256, block_n=64, num_warps=16, num_stages=3)],
    ids=["128x128", "16x32", "256x64x16warps"],
)
@pytest.mark.parametrize("pool_dtype", [None, torch.int8], ids=["16bit", "int8"])
def test_explicit_config(config, pool_dtype):
    # A tile taller than every run of new tokens, and one shorter than the prefix's tiles.
    args, scales = make_inputs([130, 9], [40, 17], (4, 2, 32), 16, torch.float32, pool_dtype)
    check(args, scales, torch.float32, config=config)


@pytest.mark.parametrize(
    "config",
    [ExtendConfig(block_m=16, block_n=16), ExtendConfig(block_m=32, block_n=16),
     ExtendConfig(block_m=16, block_n=32)],
    ids=["16x16", "32x16", "16x32"],
)
@pytest.mark.parametrize("pool_dtype", [None, torch.int8, torch.float8_e4m3fn],
                         ids=["16bit", "int8", "fp8"])  # fmt: skip
def test_full_and_partial_tiles(config, pool_dtype):
    # Prefixes of whole tiles, one key past them, under one tile and none; runs of new tokens
    # ending on and off a tile edge, so that programs score tiles before their diagonal
    # unmasked; head_dim 80 pads the tiles' columns to 128.
    args, scales = make_inputs([32, 33, 15, 0], [48, 37, 16, 50], (4, 2, 80), 16, torch.float32,
                               pool_dtype, seed=7)  # fmt: skip
    check(args, scales, torch.float32, config=config)


@pytest.mark.parametrize("pool_dtype", [None, torch.int8, torch.float8_e4m3fn],
                         ids=["16bit", "int8", "fp8"])  # fmt: skip
def test_batch_without_cached_prefix(pool_dtype):
    # max_prefix_len 0: the 16-bit kernel and config whatever the pool holds
    args, scales = make_inputs([0, 0, 0], [70, 1, 33], (6, 2, 32), 16, torch.float32,
                               pool_dtype, seed=8)  # fmt: skip
    check(args, scales, torch.float32, max_prefix_len=0)


@pytest.mark.parametrize("pack_heads", [True, False], ids=["packed", "per-head"])
@pytest.mark.parametrize("pool_dtype", [None, torch.int8], ids=["16bit", "int8"])
@pytest.mark.parametrize("heads", [(9, 3, 32), (8, 2, 32), (24, 1, 16), (6, 6, 32)], ids=str)
def test_query_heads_packed_or_not(pack_heads, pool_dtype, heads):
    # A program's rows as tokens x a kv head's query heads (3 and 4 a token, so rows of one
    # token straddle tiles; 24, so one token's rows span two programs), or tokens of one
    # head; MHA packs one head a token either way.
    args, scales = make_inputs([40, 0, 17, 5], [1, 30, 9, 23], heads, 16, torch.float32,
                               pool_dtype, seed=9)  # fmt: skip
    cfg = ExtendConfig(block_m=16, block_n=16)
    check(args, scales, torch.float32, config=cfg, pack_heads=pack_heads)


def test_config_rejects_bad_knobs():
    with pytest.raises(AssertionError, match="block_m 48 must be a power of two"):
        ExtendConfig(block_m=48)
    with pytest.raises(AssertionError, match="num_warps 3"):
        ExtendConfig(num_warps=3)


def test_default_config_on_cpu():
    cpu = torch.device("cpu")
    assert default_extend_config(128, True, cpu) == ExtendConfig()
    assert default_extend_config(256, False, cpu) == ExtendConfig(block_m=32, block_n=32)


def test_strided_qkv():
    args, _ = make_inputs([10, 30], [20, 9], (4, 2, 32), 1, torch.float32, seed=2)
    q, k_new, v_new, *rest = args
    qkv = torch.cat([q, k_new, v_new], dim=1)  # [T, Hq + 2 Hkv, D], a fused projection
    out = extend_attention(qkv[:, :4], qkv[:, 4:6], qkv[:, 6:], *rest)
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(out, extend_attention_ref(*args), atol=tol, rtol=tol)


def test_launch_grid_puts_row_blocks_first_where_it_can():
    assert launch_grid(4, 32, 10, packed_prefix=False) == ((10, 32, 4), True)
    assert launch_grid(4, 8, 128, packed_prefix=True) == ((4, 8, 128), False)
    # 70,000 one-token sequences: past axis 2's limit, so the sequences go on axis 0
    assert launch_grid(70_000, 32, 1, packed_prefix=False) == ((70_000, 32, 1), False)
    with pytest.raises(AssertionError, match="row blocks"):
        launch_grid(70_000, 8, 70_000, packed_prefix=False)


def test_rejects_bad_inputs():
    args, _ = make_inputs([3], [4], (4, 2, 16), 1, torch.float32)
    q, k_new, v_new, k_buf, v_buf, qo_indptr, *rest = args
    with pytest.raises(AssertionError, match="qo_indptr must be int32"):
        extend_attention(q, k_new, v_new, k_buf, v_buf, qo_indptr.long(), *rest)
    with pytest.raises(AssertionError, match="v_new"):
        extend_attention(q, k_new, v_new[:, :1], k_buf, v_buf, qo_indptr, *rest)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("pool_dtype", [None, torch.float8_e4m3fn, torch.int8])
def test_large_gpu(dtype, page_size, pool_dtype):  # the GPU's default configs
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 1500, (6,), generator=gen).tolist()
    new = torch.randint(1, 700, (6,), generator=gen).tolist()
    for heads in [(32, 8, 128), (9, 3, 64)]:
        args, scales = make_inputs(prefix, new, heads, page_size, dtype, pool_dtype, seed=4)
        check(args, scales, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("pool_dtype", [None, torch.float8_e4m3fn, torch.int8])
def test_short_runs_gpu(dtype, page_size, pool_dtype):  # <= SHORT_RUN rows: the 64-row default
    for heads in [(32, 8, 128), (32, 32, 128), (9, 3, 64)]:  # 64, 16 and 48 rows at most
        args, scales = make_inputs([1500, 700, 33, 0, 64], [16, 1, 9, 5, 16], heads, page_size,
                                   dtype, pool_dtype, seed=7)  # fmt: skip
        check(args, scales, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pool_dtype", [None, torch.float8_e4m3fn, torch.int8])
def test_sixteen_warps_gpu(dtype, pool_dtype):  # 256-row tiles: four warp groups a program
    cfg = ExtendConfig(block_m=256, block_n=64, num_warps=16, num_stages=3)
    args, scales = make_inputs([700, 0, 33], [300, 513, 1], (32, 8, 128), 16, dtype, pool_dtype,
                               seed=6)  # fmt: skip
    check(args, scales, dtype, config=cfg)


@pytest.mark.gpu
def test_default_config_on_the_h200():
    dev = torch.device("cuda")
    if torch.cuda.get_device_properties(dev).shared_memory_per_block_optin < 200 * 1024:
        pytest.skip("the measured defaults are the H100/H200's")
    assert default_extend_config(128, True, dev) == ExtendConfig(128, 128, num_warps=8)
    assert default_extend_config(128, False, dev) == ExtendConfig(num_stages=3)
    # every run of new tokens at most 64 query rows: the 64-row tiles, quantized or not
    assert default_extend_config(128, True, dev, rows=64) == ExtendConfig(num_stages=3)
