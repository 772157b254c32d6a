import pytest
import torch

from kernels.mla_extend import mla_extend_ref
from kernels.paging import page_slots
from tests.kernels.cases import ATTN_TOL, DEVICE, page_table, randn

DIMS = [(32, 16), (24, 8), (64, 32)]  # (Dl, Dr): power-of-two, odd, and wider latents


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


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_matches_naive(dims, page_size):
    args = make_inputs([0, 37, 5, 20], [9, 1, 0, 4], 3, dims, page_size, torch.float32)
    ref = mla_extend_ref(*args, kv_lora_rank=dims[0])
    assert ref.shape == (14, 3, dims[0])
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(ref.double(), naive(*args, dims[0]), atol=tol, rtol=tol)
