from functools import partial

import pytest
import torch

from kernels.attention.decode import (
    DecodeConfig,
    decode_attention,
    decode_attention_ref,
    decode_num_splits,
)
from kernels.kv.store import scale_pairs
from tests.kernels.attention_cases import assert_matches_ref, kv_pools
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, page_table, randn

HEADS = [(3, 3, 64), (9, 3, 48), (8, 2, 32), (8, 1, 80)]  # (Hq, Hkv, D): GQA 1, 3, 4, 8


def make_inputs(lens, heads, page_size, dtype, pool_dtype=None, seed=0, scaled=True,
                paired=True):
    """Decode inputs over a pool of `pool_dtype` (None: `dtype`), quantized per (slot, head)
    (the scales the halves of one `scale_pairs` tensor, as the engine's pool holds them, or
    two tensors when not `paired`) or, `scaled` False (fp8), cast: the codes are the values."""
    gen = torch.Generator().manual_seed(seed)
    Hq, Hkv, D = heads
    kv_indptr, kv_indices, num_slots = page_table(lens, page_size, gen)
    q = randn(len(lens), Hq, D, dtype=dtype, gen=gen)  # [B, Hq, D]
    k_buf, v_buf, scales = kv_pools(num_slots, Hkv, D, dtype, pool_dtype if scaled else None, gen)
    if scales and paired:
        pairs = scale_pairs(num_slots, Hkv, DEVICE)  # [S, Hkv, 2]
        pairs[..., 0], pairs[..., 1] = scales["k_scale"], scales["v_scale"]
        scales = {"k_scale": pairs[..., 0], "v_scale": pairs[..., 1]}
    elif pool_dtype is not None and not scaled:
        k_buf, v_buf = k_buf.to(pool_dtype), v_buf.to(pool_dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return (q, k_buf, v_buf, kv_indptr, kv_indices, seq_lens, page_size, D**-0.5), scales


# check(args, scales, dtype, **kernel_only): the kernel against its reference
check = partial(assert_matches_ref, decode_attention, decode_attention_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_matches_reference(dtype, heads, page_size):
    args, scales = make_inputs([1, 70, 133], heads, page_size, dtype)
    check(args, scales, dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_splits_and_empty_sequences(num_splits):
    # Sequence 1 is empty; with 8 splits most splits of the short sequences hold no key.
    args, scales = make_inputs([65, 0, 9, 200], (4, 2, 32), 16, torch.float32, seed=1)
    check(args, scales, torch.float32, num_splits=num_splits)
    assert (decode_attention(*args, num_splits=num_splits)[1] == 0).all()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "pool_dtype",
    [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")],
)
@pytest.mark.parametrize("heads", [(4, 4, 64), (6, 2, 32), (8, 2, 128), (8, 1, 64)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_pool(dtype, pool_dtype, page_size, heads):
    # GQA 1, 3, 4, 8; sequences of 1, 5 and many tokens (a partial last tile); fewer on the CPU.
    # A 16-bit q takes the fp16-dot path (int8 through its 1152 offset); float32 q its own.
    lens = [1, 5, 1030 if DEVICE == "cuda" else 300]
    args, scales = make_inputs(lens, heads, page_size, dtype, pool_dtype, seed=2)
    check(args, scales, dtype)


@pytest.mark.parametrize(
    "config",
    [DecodeConfig(use_dot=True), DecodeConfig(block_n=16), DecodeConfig(block_n=128)],
    ids=str,
)
def test_launch_configs(config):
    # A single-head group through tl.dot (padded to 16 rows), and other tile widths.
    args, scales = make_inputs([1, 70, 133], (3, 3, 64), 16, torch.float32, seed=9)
    check(args, scales, torch.float32, config=config)


def test_contiguous_regions():
    # page_size = max_len: one region per request, as the `contiguous` KV mode lays it out.
    args, scales = make_inputs([40, 96, 3], (4, 2, 32), 96, torch.float32, seed=3)
    check(args, scales, torch.float32)


def test_strided_q_and_out_buffer():
    (q, *rest), _ = make_inputs([30, 77], (6, 3, 32), 16, torch.float32, seed=4)
    qkv = randn(2, 6 + 2 * 3, 32, gen=torch.Generator().manual_seed(5))  # fused projection
    qkv[:, :6] = q
    out = torch.full_like(q, float("nan"))
    got = decode_attention(qkv[:, :6], *rest, out=out)
    assert got.data_ptr() == out.data_ptr()
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(out, decode_attention_ref(q, *rest), atol=tol, rtol=tol)


def test_int64_indices():
    (q, k, v, indptr, indices, *rest), _ = make_inputs([50, 20], (2, 2, 16), 16, torch.float32)
    out = decode_attention(q, k, v, indptr, indices.long(), *rest)
    ref = decode_attention_ref(q, k, v, indptr, indices, *rest)
    torch.testing.assert_close(out, ref, atol=ATTN_TOL[torch.float32], rtol=ATTN_TOL[torch.float32])


def test_num_splits_heuristic():
    assert decode_num_splits(64, 32, 4096) == 1  # 2048 programs: >= 4 per SM on 132 SMs
    assert decode_num_splits(64, 8, 4096) == 2  # 512 programs: 2 splits for 4 per SM
    assert decode_num_splits(1, 8, 32768) == 32  # capped at MAX_SPLITS
    assert decode_num_splits(1, 8, 300) == 2  # no split shorter than 256 tokens
    assert decode_num_splits(4, 8, 1) == 1
    # a quantized pool's stage 1: half as many programs (2 per SM)
    assert decode_num_splits(64, 8, 4096, quantized=True) == 1  # 512 programs
    assert decode_num_splits(32, 8, 4096, quantized=True) == 2  # 3 unquantized
    assert decode_num_splits(1, 8, 32768, quantized=True) == 32
    assert decode_num_splits(1, 32, 32768, quantized=True) == 9  # 17 unquantized


def test_rejects_bad_inputs():
    (q, k, v, indptr, indices, lens, *rest), _ = make_inputs([5], (4, 4, 16), 1, torch.float32)
    with pytest.raises(AssertionError, match="not a multiple"):
        decode_attention(q[:, :3], k, v, indptr, indices, lens, *rest)
    with pytest.raises(AssertionError, match="seq_lens must be int32"):
        decode_attention(q, k, v, indptr, indices, lens.long(), *rest)
    with pytest.raises(AssertionError, match="needs k_scale"):
        decode_attention(q, k.to(torch.int8), v.to(torch.int8), indptr, indices, lens, *rest)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("pool_dtype", [None, torch.float8_e4m3fn, torch.int8])
def test_large_gpu(dtype, page_size, pool_dtype):
    lens = torch.randint(1, 3000, (17,), generator=torch.Generator().manual_seed(6)).tolist()
    args, scales = make_inputs(lens, (32, 8, 128), page_size, dtype, pool_dtype, seed=7)
    check(args, scales, dtype)
    args, scales = make_inputs(lens, (32, 32, 128), page_size, dtype, pool_dtype, seed=8)
    check(args, scales, dtype)
