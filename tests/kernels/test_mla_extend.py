from functools import partial

import pytest
import torch

from kernels.attention.mla_extend import mla_extend, mla_extend_ref
from kernels.kv.paging import page_slots
from tests.kernels.attention_cases import (
    assert_mla_matches_ref,
    assert_ref_matches_naive,
    quantize_latent,
)
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, page_table, randn
from tests.kernels.mla_matrix import MLA_DIMS, deepseek_gpu_cases, mla_cases


def make_inputs(prefix, new, heads, dims, page_size, dtype, seed=0):
    """Extend inputs; the new tokens' rows are also stored in the pool after the prefix."""
    gen = torch.Generator().manual_seed(seed)
    Dl, Dr = dims
    T = sum(new)
    kv_indptr, kv_indices, num_slots = page_table(
        [p + n for p, n in zip(prefix, new, strict=True)], page_size, gen
    )
    q = randn(T, heads, Dl + Dr, dtype=dtype, gen=gen)  # [T, H, Dl + Dr]
    kv_new = randn(T, 1, Dl + Dr, dtype=dtype, gen=gen)  # [T, 1, Dl + Dr]
    kv_pool = randn(num_slots, 1, Dl + Dr, dtype=dtype, gen=gen)  # [S, 1, Dl + Dr]
    qo_indptr = torch.tensor([0, *new], device=DEVICE).cumsum(0, dtype=torch.int32)
    for b, (p, n) in enumerate(zip(prefix, new, strict=True)):
        lo = int(qo_indptr[b])
        kv_pool[page_slots(kv_indptr, kv_indices, b, p + n, page_size)[p:]] = kv_new[lo : lo + n]
    prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=DEVICE)
    scale = (Dl + Dr) ** -0.5
    return q, kv_new, kv_pool, qo_indptr, prefix_lens, kv_indptr, kv_indices, page_size, scale


def naive(q, kv_new, kv_pool, qo_indptr, prefix_lens, kv_indptr, kv_indices, page_size, sm_scale,
          kv_lora_rank):  # fmt: skip
    """Per new token and head: softmax over the pool rows up to itself, in float64 (the new
    rows were stored in the pool by make_inputs)."""
    T, H, _ = q.shape
    out = torch.zeros(T, H, kv_lora_rank, dtype=torch.float64, device=q.device)
    for b, prefix in enumerate(prefix_lens.tolist()):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        slots = page_slots(kv_indptr, kv_indices, b, prefix + hi - lo, page_size)
        rows = kv_pool[slots, 0].double()  # [P+n, D]
        for t in range(lo, hi):
            seen = rows[: prefix + t - lo + 1]
            for h in range(H):
                p = torch.softmax(seen @ q[t, h].double() * sm_scale, 0)
                out[t, h] = p @ seen[:, :kv_lora_rank]
    return out


@pytest.mark.parametrize("dims", MLA_DIMS, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_matches_naive(dims, page_size):
    args = make_inputs([0, 37, 5, 20], [9, 1, 0, 4], 3, dims, page_size, torch.float32)
    assert_ref_matches_naive(mla_extend_ref, naive, args, dims[0], (14, 3, dims[0]))


# check(args, dtype, kv_lora_rank, kv_scale): the kernel against its reference
check = partial(assert_mla_matches_ref, mla_extend, mla_extend_ref)


@mla_cases([1, 3, 19])
def test_matches_reference(dtype, dims, heads, page_size):
    # Prefixes 0 / unaligned / long; new runs across a block, of one token, and unaligned.
    args = make_inputs([0, 37, 70], [70, 1, 12], heads, dims, page_size, dtype, seed=heads)
    check(args, dtype, dims[0])


def test_empty_sequence_and_explicit_max_len():
    args = make_inputs([20, 5, 0], [3, 0, 66], 4, (32, 16), 16, torch.float32, seed=1)
    check(args, torch.float32, 32, max_new_len=66)


@pytest.mark.parametrize(
    "pool_dtype",
    [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_prefix(dtype, pool_dtype):
    # The prefix is read from an 8-bit pool; the new rows stay in q's dtype.
    args = make_inputs([70, 17, 0], [5, 40, 3], 6, (24, 8), 16, dtype, seed=6)
    args, kv_scale = quantize_latent(args, 2, pool_dtype)
    check(args, dtype, 24, kv_scale)


def test_more_heads_than_a_block():
    # 70 heads > the 64-row block: a token's heads span two programs.
    args = make_inputs([5, 0], [3, 2], 70, (32, 16), 16, torch.float32, seed=5)
    check(args, torch.float32, 32)


def test_strided_q_and_kv_new():
    # q and the new latent rows as views of one fused projection output.
    q, kv_new, *rest = make_inputs([10, 30], [20, 9], 4, (24, 8), 1, torch.float32, seed=2)
    fused = torch.cat([q.flatten(1), kv_new.flatten(1)], dim=1)  # [T, 4 * 32 + 32]
    out = mla_extend(fused[:, :128].view(-1, 4, 32), fused[:, None, 128:], *rest, kv_lora_rank=24)
    tol = ATTN_TOL[torch.float32]
    ref = mla_extend_ref(q, kv_new, *rest, kv_lora_rank=24)
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def test_rejects_bad_inputs():
    q, kv_new, kv, qo_indptr, *rest = make_inputs([3], [4], 2, (32, 16), 1, torch.float32)
    with pytest.raises(AssertionError, match="qo_indptr must be int32"):
        mla_extend(q, kv_new, kv, qo_indptr.long(), *rest, kv_lora_rank=32)
    with pytest.raises(AssertionError, match="kv_new"):
        mla_extend(q, kv_new[:, :, :40], kv, qo_indptr, *rest, kv_lora_rank=32)


@deepseek_gpu_cases
def test_deepseek_shapes_gpu(dtype, heads, page_size, pool_dtype):
    # Dl 512 + Dr 64 as DeepSeek-V2/V3; ragged prefixes and new runs.
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 1500, (5,), generator=gen).tolist()
    new = torch.randint(1, 300, (5,), generator=gen).tolist()
    args, kv_scale = make_inputs(prefix, new, heads, (512, 64), page_size, dtype, seed=4), None
    if pool_dtype is not None:
        args, kv_scale = quantize_latent(args, 2, pool_dtype)
    check(args, dtype, 512, kv_scale)
