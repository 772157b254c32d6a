import pytest
import torch

from kernels.gemm.lora import lora_expand, lora_expand_ref, lora_shrink, lora_shrink_ref
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, randn


def segments(token_slots: list[int], num_slots: int) -> tuple[torch.Tensor, list[int]]:
    """`order` (tokens grouped by slot, no-adapter tokens left out) and the host indptr."""
    order = [t for s in range(num_slots) for t, ts in enumerate(token_slots) if ts == s]
    counts = [token_slots.count(s) for s in range(num_slots)]
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    return torch.tensor(order, dtype=torch.int64, device=DEVICE), indptr


def naive(x, a, b, token_slots, slices):
    """y delta of each token from its own adapter, one token at a time (float32)."""
    R = b.shape[2]
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float32, device=x.device)
    for t, s in enumerate(token_slots):
        if s < 0:
            continue
        col = 0
        for j, w in enumerate(slices):
            h = x[t].float() @ a[s, j * R:(j + 1) * R].float().t()  # [R]
            out[t, col:col + w] = h @ b[s, col:col + w].float().t()
            col += w
    return out


CASES = [
    # tokens, in, rank, slices, slots, token slot pattern
    (37, 45, 5, (24, 8, 8), 3, "mixed"),  # fused q/k/v, odd in and rank
    (9, 70, 16, (50, 50), 4, "mixed"),  # gate/up
    (1, 33, 7, (19,), 2, "mixed"),  # one decode token
    (40, 96, 8, (130,), 3, "one-slot"),  # a long segment of one adapter (prefill)
    (12, 17, 3, (11,), 2, "none"),  # no token has an adapter
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}-in{c[1]}-r{c[2]}-{c[5]}")
def test_segmented_matmuls_match_reference_and_naive(case, dtype):
    T, K, R, slices, L, pattern = case
    gen = torch.Generator().manual_seed(T * 131 + K)
    out = sum(slices)
    x = randn(T, K, dtype=dtype, gen=gen)  # [T, in]
    a = randn(L, len(slices) * R, K, dtype=dtype, gen=gen) * 0.3  # [L, n*R, in]
    b = randn(L, out, R, dtype=dtype, gen=gen) * 0.3  # [L, out, R]
    if pattern == "mixed":  # every slot but the last, and tokens without an adapter
        token_slots = torch.randint(-1, L - 1, (T,), generator=gen).tolist()
    elif pattern == "one-slot":
        token_slots = [1] * T
    else:
        token_slots = [-1] * T
    order, indptr = segments(token_slots, L)
    indptr_dev = torch.tensor(indptr, dtype=torch.int32, device=DEVICE)
    max_len = max(hi - lo for lo, hi in zip(indptr, indptr[1:]))
    base = randn(T, out, dtype=dtype, gen=gen)  # [T, out], what the base projection gave

    tmp = lora_shrink(x, a, order, indptr_dev, max_len)  # [T, n*R]
    tmp_ref = lora_shrink_ref(x, a, order, indptr)
    tol = ATTN_TOL[dtype]
    rows = order.cpu()
    torch.testing.assert_close(tmp[rows], tmp_ref[rows], atol=tol, rtol=tol)

    y, y_ref = base.clone(), base.clone()
    lora_expand(y, tmp, b, order, indptr_dev, max_len, slices)
    lora_expand_ref(y_ref, tmp_ref, b, order, indptr, slices)
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    want = (base.float() + naive(x, a, b, token_slots, slices)).to(dtype)
    torch.testing.assert_close(y_ref, want, atol=tol, rtol=tol)
    no_adapter = torch.tensor([s < 0 for s in token_slots], device=DEVICE)
    assert torch.equal(y[no_adapter], base[no_adapter])  # rows of no adapter are untouched


def test_graph_sized_grid_reads_the_segments_from_the_device():
    """A grid sized for the whole batch (as a captured graph's) gives the same result as
    one sized for the longest segment: the programs past a segment's end do nothing."""
    gen = torch.Generator().manual_seed(5)
    T, K, R, slices, L = 20, 24, 4, (12, 6, 6), 3
    x = randn(T, K, gen=gen)
    a, b = randn(L, 3 * R, K, gen=gen), randn(L, sum(slices), R, gen=gen)
    order, indptr = segments([0, 2, -1, 2] * 5, L)
    indptr_dev = torch.tensor(indptr, dtype=torch.int32, device=DEVICE)
    tight = lora_shrink(x, a, order, indptr_dev, 10)
    wide = lora_shrink(x, a, order, indptr_dev, T)
    rows = order.cpu()
    torch.testing.assert_close(tight[rows], wide[rows], atol=0, rtol=0)
    y1, y2 = torch.zeros(T, 24, device=DEVICE), torch.zeros(T, 24, device=DEVICE)
    lora_expand(y1, tight, b, order, indptr_dev, 10, slices)
    lora_expand(y2, tight, b, order, indptr_dev, T, slices)
    torch.testing.assert_close(y1, y2, atol=0, rtol=0)


def test_rejects_mismatched_shapes():
    x, a = torch.zeros(3, 8), torch.zeros(2, 4, 9)
    order, indptr = torch.zeros(0, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)
    with pytest.raises(AssertionError, match="does not take"):
        lora_shrink(x, a, order, indptr, 0)
    with pytest.raises(AssertionError, match="slices"):
        lora_expand(torch.zeros(3, 10), torch.zeros(3, 4, dtype=torch.float32),
                    torch.zeros(2, 10, 4), order, indptr, 0, (4, 4))
