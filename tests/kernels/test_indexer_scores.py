import pytest
import torch

from kernels.sparse.index_lists import top_entries
from kernels.sparse.indexer_scores import indexer_scores, indexer_scores_ref
from tests.kernels.cases import DEVICE, DTYPES, randn

# the scores sum h products of di terms: an absolute bound per dtype of q_idx and the keys
SCORE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_inputs(Q, h, di, n, dtype, seed=0):
    """(q_idx, weights, keys, visible_upto): keys a column range of wider rows, visible_upto
    from 0 (nothing visible) to past n."""
    gen = torch.Generator().manual_seed(seed)
    q_idx = randn(Q, h, di, dtype=dtype, gen=gen)  # [Q, h, di]
    weights = randn(Q, h, gen=gen) * h**-0.5  # [Q, h] float32
    keys = randn(n, di + 6, dtype=dtype, gen=gen)[:, 2 : 2 + di]  # [n, di]
    visible_upto = torch.randint(0, n + 4, (Q,), generator=gen).to(DEVICE)  # [Q]
    return q_idx, weights, keys, visible_upto


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
    check(make_inputs(Q, h, di, n, dtype, seed=Q), dtype)


def test_masking():
    q_idx, weights, keys, _ = make_inputs(3, 4, 64, 70, torch.float32, seed=1)
    upto = torch.tensor([0, 5, 70], device=DEVICE)
    out = check((q_idx, weights, keys, upto), torch.float32)
    assert (out[0] == float("-inf")).all()
    assert out[1, :5].isfinite().all() and (out[1, 5:] == float("-inf")).all()
    assert out[2].isfinite().all()


def test_relu_per_head():
    # a head whose products are all negative adds nothing: scores are the other head's
    keys = torch.eye(2, 16, device=DEVICE)  # [2, 16]
    q_idx = torch.zeros(1, 2, 16, device=DEVICE)
    q_idx[0, 0, 0], q_idx[0, 1, 0], q_idx[0, 1, 1] = 3.0, -5.0, 2.0
    weights = torch.tensor([[0.5, 2.0]], device=DEVICE)
    out = indexer_scores(q_idx, weights, keys, torch.tensor([2], device=DEVICE), scale=1.0)
    assert out.tolist() == [[1.5, 4.0]]


def test_empty():
    q_idx, weights, keys, upto = make_inputs(3, 4, 64, 0, torch.float32)
    assert indexer_scores(q_idx, weights, keys, upto).shape == (3, 0)
    q_idx, weights, keys, upto = make_inputs(0, 4, 64, 9, torch.float32)
    assert indexer_scores(q_idx, weights, keys, upto).shape == (0, 9)


def test_top_entries():
    inf = float("-inf")
    scores = torch.tensor([[0.5, 2.0, -1.0, 3.0], [inf, 1.0, inf, inf], [inf] * 4])
    assert top_entries(scores, 2).tolist() == [[3, 1], [1, -1], [-1, -1]]
    assert top_entries(scores, 6).tolist() == [[3, 1, 0, 2, -1, -1], [1, -1, -1, -1, -1, -1],
                                               [-1] * 6]


def test_rejects_bad_inputs():
    q_idx, weights, keys, upto = make_inputs(2, 4, 64, 9, torch.float32)
    with pytest.raises(AssertionError, match=r"keys must be \[n, 64\]"):
        indexer_scores(q_idx, weights, keys[:, :32], upto)
    with pytest.raises(AssertionError, match=r"weights must be a float \[2, 4\]"):
        indexer_scores(q_idx, weights[:, :3], keys, upto)
    with pytest.raises(AssertionError, match="visible_upto must be int32/int64"):
        indexer_scores(q_idx, weights, keys, upto.float())
