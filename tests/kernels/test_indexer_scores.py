import pytest
import torch

from kernels.sparse.index_lists import (
    position_slots,
    query_seqs,
    top_entries,
    visible_entries,
)
from kernels.sparse.indexer_scores import indexer_scores, indexer_scores_ref
from tests.kernels.cases import DEVICE, DTYPES, page_table, randn

# the scores sum h products of di terms: an absolute bound per dtype of q_idx and the keys
SCORE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_inputs(Q, h, di, n, dtype, slots=50, seed=0):
    """(q_idx, weights, keys, key_indices): keys a column range of wider rows, each query's
    list of n slots random, -1 anywhere (a row of none among them)."""
    gen = torch.Generator().manual_seed(seed)
    q_idx = randn(Q, h, di, dtype=dtype, gen=gen)  # [Q, h, di]
    weights = randn(Q, h, gen=gen) * h**-0.5  # [Q, h] float32
    keys = randn(slots, di + 6, dtype=dtype, gen=gen)[:, 2 : 2 + di]  # [slots, di]
    listed = torch.randint(0, slots, (Q, n), generator=gen)
    listed[torch.rand(Q, n, generator=gen) < 0.3] = -1
    listed[Q // 2 : Q // 2 + 1] = -1
    return q_idx, weights, keys, listed.to(DEVICE)


def check(args, dtype):
    out = indexer_scores(*args)
    want = indexer_scores_ref(*args)
    tol = SCORE_TOL[dtype]
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("di", [64, 128])
@pytest.mark.parametrize("Q, h, n", [(1, 16, 45), (3, 3, 130), (37, 19, 7)], ids=str)
def test_matches_reference(Q, h, n, di, dtype):
    # 3 and 19 heads leave a partial 16-head block; 130 keys a partial 64-key tile
    out = check(make_inputs(Q, h, di, n, dtype, seed=Q), dtype)
    assert (out[Q // 2] == float("-inf")).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_step_of_sequences_scores_its_own_keys(dtype):
    """One call over a step's queries: sequences of 37, 3 (no entry yet) and 130 positions
    in shuffled pages, entries of 4 tokens (9, 0 and 32 of them), each query's scores those
    of its own sequence's keys alone, as one call a sequence on its own keys would give."""
    rate, page, lens, new = 4, 4, [37, 3, 130], [5, 3, 70]
    gen = torch.Generator().manual_seed(3)
    kv_indptr, kv_indices, num_slots = page_table(lens, page, gen)
    q_idx, weights, _, _ = make_inputs(sum(new), 5, 64, 1, dtype, seed=4)
    keys = randn(num_slots, 64, dtype=dtype, gen=gen)  # [slots, di]
    qo_indptr = torch.tensor([0, *new], device=DEVICE).cumsum(0).int()
    positions = torch.cat([torch.arange(n - q, n) for n, q in zip(lens, new)]).to(DEVICE)
    seqs = query_seqs(qo_indptr, positions.shape[0])
    seen = visible_entries(positions, rate, max(lens) // rate)  # [T, 32]
    closing = torch.where(seen >= 0, (seen.long() + 1) * rate - 1, -1)  # [T, 32] positions
    listed = position_slots(closing, seqs, kv_indptr, kv_indices, page)  # their keys' slots
    out = check((q_idx, weights, keys, listed), dtype)
    for b, (lo, hi) in enumerate(zip(qo_indptr[:-1].tolist(), qo_indptr[1:].tolist())):
        ends = torch.arange(lens[b] // rate, device=DEVICE) * rate + rate - 1  # closing
        own = kv_indices[kv_indptr[b] + ends // page].long() * page + ends % page  # [n_b]
        upto = ((positions[lo:hi] + 1) // rate)[:, None]
        alone = torch.where(torch.arange(own.shape[0], device=DEVICE) < upto, own, -1)
        want = indexer_scores_ref(q_idx[lo:hi], weights[lo:hi], keys, alone)
        tol = SCORE_TOL[dtype]
        torch.testing.assert_close(out[lo:hi, : own.shape[0]], want, atol=tol, rtol=tol)
        assert (out[lo:hi, own.shape[0] :] == float("-inf")).all()
    assert (out[5:8] == float("-inf")).all()  # the 3-token sequence sees no entry


def test_relu_per_head():
    # a head whose products are all negative adds nothing: scores are the other head's
    keys = torch.eye(3, 16, device=DEVICE)  # [3, 16]
    q_idx = torch.zeros(1, 2, 16, device=DEVICE)
    q_idx[0, 0, 0], q_idx[0, 1, 0], q_idx[0, 1, 1] = 3.0, -5.0, 2.0
    weights = torch.tensor([[0.5, 2.0]], device=DEVICE)
    listed = torch.tensor([[1, -1, 0, 2]], device=DEVICE)
    out = indexer_scores(q_idx, weights, keys, listed, scale=1.0)
    assert out.tolist() == [[4.0, float("-inf"), 1.5, 0.0]]


def test_empty():
    q_idx, weights, keys, listed = make_inputs(3, 4, 64, 0, torch.float32)
    assert indexer_scores(q_idx, weights, keys, listed).shape == (3, 0)
    q_idx, weights, keys, listed = make_inputs(0, 4, 64, 9, torch.float32)
    assert indexer_scores(q_idx, weights, keys, listed).shape == (0, 9)


def test_top_entries():
    inf = float("-inf")
    scores = torch.tensor([[0.5, 2.0, -1.0, 3.0], [inf, 1.0, inf, inf], [inf] * 4])
    assert top_entries(scores, 2).tolist() == [[1, 3], [1, -1], [-1, -1]]  # entry order
    assert top_entries(scores, 6).tolist() == [[0, 1, 2, 3, -1, -1], [1, -1, -1, -1, -1, -1],
                                               [-1] * 6]


def test_top_entries_break_ties_toward_the_earlier_entry_whatever_the_width():
    """Relu'd scores tie (at 0 where every head is negative): the earlier entry wins, so a
    query's picks do not depend on how wide the step's lists are (the batch's longest
    sequence), nor on where the tied entries lie."""
    inf = float("-inf")
    row = [0.7, 0.0, 0.2, 0.0, 0.5, 0.0, 0.1, 0.3, 0.0]  # 9 visible, 4 of them at 0
    for width in range(9, 40):
        scores = torch.tensor([row + [inf] * (width - 9)])
        assert top_entries(scores, 8).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]], width
    ties = torch.tensor([[1.0] * 64])
    assert top_entries(ties, 5).tolist() == [[0, 1, 2, 3, 4]]
    signed = torch.tensor([[-1.0, -0.0, -2.0, 0.0, -1.0, -2.0, inf]])
    assert top_entries(signed, 3).tolist() == [[0, 1, 3]]  # -0.0 ties 0.0
    assert top_entries(signed[:, :0], 2).tolist() == [[-1, -1]]


def test_rejects_bad_inputs():
    q_idx, weights, keys, listed = make_inputs(2, 4, 64, 9, torch.float32)
    with pytest.raises(AssertionError, match=r"keys must be \[slots, 64\]"):
        indexer_scores(q_idx, weights, keys[:, :32], listed)
    with pytest.raises(AssertionError, match=r"weights must be a float \[2, 4\]"):
        indexer_scores(q_idx, weights[:, :3], keys, listed)
    with pytest.raises(AssertionError, match="key_indices must be int32/int64"):
        indexer_scores(q_idx, weights, keys, listed.float())
    with pytest.raises(AssertionError, match=r"key_indices must be int32/int64 \[2, n\]"):
        indexer_scores(q_idx, weights, keys, listed[:1])
