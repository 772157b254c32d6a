from functools import partial

import pytest
import torch

from kernels.attention.mla_decode import (
    MlaDecodeConfig,
    mla_decode,
    mla_decode_num_splits,
    mla_decode_ref,
)
from kernels.kv.paging import page_slots
from tests.kernels.attention_cases import (
    assert_mla_matches_ref,
    assert_ref_matches_naive,
    quantize_latent,
)
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, page_table, randn
from tests.kernels.mla_matrix import MLA_DIMS, deepseek_gpu_cases, mla_cases

QUANT_POOLS = [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")]


def make_inputs(lens, heads, dims, page_size, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    Dl, Dr = dims
    kv_indptr, kv_indices, num_slots = page_table(lens, page_size, gen)
    q = randn(len(lens), heads, Dl + Dr, dtype=dtype, gen=gen)  # [B, H, Dl + Dr]
    kv_pool = randn(num_slots, 1, Dl + Dr, dtype=dtype, gen=gen)  # [S, 1, Dl + Dr]
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return q, kv_pool, kv_indptr, kv_indices, seq_lens, page_size, (Dl + Dr) ** -0.5


def naive(q, kv_pool, kv_indptr, kv_indices, seq_lens, page_size, sm_scale, kv_lora_rank):
    """Per sequence and head: softmax(q . rows) @ rows[:, :Dl], in float64."""
    B, H, _ = q.shape
    out = torch.zeros(B, H, kv_lora_rank, dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        rows = kv_pool[page_slots(kv_indptr, kv_indices, b, n, page_size), 0].double()  # [n, D]
        for h in range(H):
            p = torch.softmax(rows @ q[b, h].double() * sm_scale, 0)  # [n]
            out[b, h] = p @ rows[:, :kv_lora_rank]
    return out


@pytest.mark.parametrize("dims", MLA_DIMS, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_matches_naive(dims, page_size):
    args = make_inputs([1, 70, 0, 33], 5, dims, page_size, torch.float32)
    assert_ref_matches_naive(mla_decode_ref, naive, args, dims[0], (4, 5, dims[0]))


# check(args, dtype, kv_lora_rank, kv_scale): the kernel against its reference
check = partial(assert_mla_matches_ref, mla_decode, mla_decode_ref)


@mla_cases([1, 5, 19])
def test_matches_reference(dtype, dims, heads, page_size):
    # Heads below, between and above one 16-head group; lengths 1, a partial tile, 70.
    args = make_inputs([1, 70, 23], heads, dims, page_size, dtype, seed=heads)
    check(args, dtype, dims[0])


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_splits_and_empty_sequences(num_splits):
    # Sequence 1 is empty; with 8 splits most splits of the short sequences hold no row.
    args = make_inputs([65, 0, 9, 130], 4, (32, 16), 16, torch.float32, seed=1)
    out = check(args, torch.float32, 32, num_splits=num_splits)
    assert (out[1] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pool_dtype", QUANT_POOLS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_quantized_pool(dtype, pool_dtype, page_size):
    # 8-bit rows with one float32 scale each; split and unsplit.
    args = make_inputs([1, 70, 23], 19, (24, 8), page_size, dtype, seed=7)
    args, kv_scale = quantize_latent(args, 1, pool_dtype)
    check(args, dtype, 24, kv_scale)
    check(args, dtype, 24, kv_scale, num_splits=3)


@pytest.mark.parametrize(
    "config",
    [MlaDecodeConfig(block_h=32, block_n=16), MlaDecodeConfig(block_n=64, num_warps=8)],
    ids=str,
)
def test_launch_configs(config):
    args = make_inputs([1, 50, 37], 19, (24, 8), 1, torch.float32, seed=2)
    check(args, torch.float32, 24, config=config)


def test_strided_q_and_out_buffer():
    q, *rest = make_inputs([30, 77], 6, (32, 16), 16, torch.float32, seed=3)
    wide = randn(2, 6, 80, gen=torch.Generator().manual_seed(4))  # q rows inside a wider tensor
    wide[..., :48] = q
    out = torch.full((2, 6, 32), float("nan"), device=DEVICE)
    got = mla_decode(wide[..., :48], *rest, kv_lora_rank=32, num_splits=2, out=out)
    assert got.data_ptr() == out.data_ptr()
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(out, mla_decode_ref(q, *rest, kv_lora_rank=32), atol=tol, rtol=tol)


def test_config_rejects_bad_knobs():
    with pytest.raises(AssertionError, match="block_h 8 must be a power of two"):
        MlaDecodeConfig(block_h=8)
    with pytest.raises(AssertionError, match="num_warps 3"):
        MlaDecodeConfig(num_warps=3)
    with pytest.raises(AssertionError, match="num_stages 0"):
        MlaDecodeConfig(num_stages=0)


def test_num_splits_heuristic():
    assert mla_decode_num_splits(1, 16, 4096) == 16  # one head group: 4096 / 256 tokens
    assert mla_decode_num_splits(128, 128, 4096) == 1  # 1024 programs already
    assert mla_decode_num_splits(32, 128, 4096) == 3  # 256 programs, 528 wanted


def test_rejects_bad_inputs():
    q, kv, indptr, indices, lens, *rest = make_inputs([5], 4, (32, 16), 1, torch.float32)
    with pytest.raises(AssertionError, match="kv_pool"):
        mla_decode(q, kv[..., :40], indptr, indices, lens, *rest, kv_lora_rank=32)
    with pytest.raises(AssertionError, match="must exceed kv_lora_rank"):
        mla_decode(q, kv, indptr, indices, lens, *rest)  # the default rank 512 is too wide
    with pytest.raises(AssertionError, match="seq_lens must be int32"):
        mla_decode(q, kv, indptr, indices, lens.long(), *rest, kv_lora_rank=32)
    with pytest.raises(AssertionError, match="needs kv_scale"):
        mla_decode(q, kv.to(torch.int8), indptr, indices, lens, *rest, kv_lora_rank=32)


@deepseek_gpu_cases
def test_deepseek_shapes_gpu(dtype, heads, page_size, pool_dtype):
    # Dl 512 + Dr 64 as DeepSeek-V2/V3, ragged lengths up to 3000, split and unsplit.
    lens = torch.randint(1, 3000, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    args, kv_scale = make_inputs(lens, heads, (512, 64), page_size, dtype, seed=6), None
    if pool_dtype is not None:
        args, kv_scale = quantize_latent(args, 1, pool_dtype)
    check(args, dtype, 512, kv_scale)
    check(args, dtype, 512, kv_scale, num_splits=1)
