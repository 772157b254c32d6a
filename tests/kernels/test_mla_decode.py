import pytest
import torch

from kernels.mla_decode import mla_decode_ref
from kernels.paging import page_slots
from tests.kernels.cases import ATTN_TOL, DEVICE, page_table, randn

DIMS = [(32, 16), (24, 8), (64, 32)]  # (Dl, Dr): power-of-two, odd, and wider latents


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


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
def test_reference_matches_naive(dims, page_size):
    args = make_inputs([1, 70, 0, 33], 5, dims, page_size, torch.float32)
    ref = mla_decode_ref(*args, kv_lora_rank=dims[0])
    assert ref.shape == (4, 5, dims[0])
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(ref.double(), naive(*args, dims[0]), atol=tol, rtol=tol)
