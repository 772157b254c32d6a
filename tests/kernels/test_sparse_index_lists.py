"""The key lists of `kernels.sparse.index_lists`, exactly on a tiny batch, and the whole sparse
path (lists, indexer scores, attention) against DeepSeek-V4's attention math written densely:
per sequence, the window rows and the entries closed by each query in one softmax with a sink,
the entries in an entry pool by id (ids from the page table, or from entry tables)."""

import pytest
import torch

from kernels.kv.paging import expand_pages
from kernels.sparse.index_lists import (
    entry_indices,
    entry_of_slot,
    paged_entry_indices,
    query_seqs,
    top_entries,
    visible_entries,
    window_indices,
)
from kernels.sparse.indexer_scores import indexer_scores
from kernels.sparse.sparse_mqa import sparse_mqa_attention
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, page_table, randn

WINDOW, RATE, TOPK, PAGE = 8, 4, 3, 4
H, D, INDEX_HEADS, INDEX_DIM = 3, 64, 5, 32


def tensor(values) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


def test_lists_of_a_tiny_batch():
    # sequence 0: positions 0..5 in pages 3, 1; sequence 1: positions 0..9 in pages 0, 4, 2
    kv_indptr = tensor([0, 2, 5]).int()
    kv_indices = tensor([3, 1, 0, 4, 2]).int()
    qo_indptr = tensor([0, 2, 3]).int()  # new tokens: positions 4, 5 of seq 0; 9 of seq 1
    positions = tensor([4, 5, 9])
    seqs = query_seqs(qo_indptr, 3)
    assert seqs.tolist() == [0, 0, 1]
    win = window_indices(positions, seqs, kv_indptr, kv_indices, PAGE, 6)
    assert win.dtype == torch.int32
    assert win.tolist() == [[-1, 12, 13, 14, 15, 4], [12, 13, 14, 15, 4, 5],
                            [16, 17, 18, 19, 8, 9]]
    ent = visible_entries(positions, 2, 4)  # entries of 2 tokens: w seen once 2w + 1 <= p
    assert ent.tolist() == [[0, 1, -1, -1], [0, 1, 2, -1], [0, 1, 2, 3]]
    # entries of 2 tokens close at positions 1, 3, 5, 7: slots 13, 15, 5 (seq 0) and 1, 3,
    # 17, 19 (seq 1); pages of 4 hold 2 ids each, page * 2 + offset // 2
    ids = paged_entry_indices(ent, seqs, kv_indptr, kv_indices, PAGE, 2)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [[6, 7, -1, -1], [6, 7, 2, -1], [0, 1, 8, 9]]
    # rates larger than a page: one id a page (positions 3, 7 with rate 4 under pages of 2)
    assert entry_of_slot(tensor([7, 9, 10, 13]), 2, 4).tolist() == [3, 4, 5, 6]
    # from entry tables: window w of request row r has id 10 * r + w (rows 1, 1, 0)
    table = 10 * torch.arange(2, device=DEVICE)[:, None] + torch.arange(5, device=DEVICE)
    ids = entry_indices(ent, tensor([1, 1, 0]), table)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [[10, 11, -1, -1], [10, 11, 12, -1], [0, 1, 2, 3]]


def dense_v4_attention(q, kv, entry, slots, p0, p1, sink, picked=None):
    """DeepSeek-V4's attention of one sequence's queries `[Q, H, d]` at positions p0 .. p1
    (slots `[p1]`), dense: window keys (t - WINDOW, t], every entry closed by t (or those of
    `picked` `[Q, n]` bool), one softmax whose denominator holds exp(sink)."""
    pos = torch.arange(p0, p1, device=DEVICE)  # [Q]
    lo = max(p0 - WINDOW + 1, 0)
    key_pos = torch.arange(lo, p1, device=DEVICE)  # [K]
    allowed = (key_pos[None, :] <= pos[:, None]) & (key_pos[None, :] > pos[:, None] - WINDOW)
    n = p1 // RATE
    entries = entry[entry_of_slot(slots[RATE - 1 : n * RATE : RATE], PAGE, RATE)]  # [n, d]
    seen = torch.arange(n, device=DEVICE)[None, :] < ((pos + 1) // RATE)[:, None]  # [Q, n]
    if picked is not None:
        seen = seen & picked
    keys = torch.cat([kv[slots[lo:p1]], entries]).to(q.dtype)  # [K + n, d]
    allowed = torch.cat([allowed, seen], dim=1)
    scores = torch.einsum("qhd,kd->qhk", q, keys) * D**-0.5  # [Q, H, K + n]
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    sink = sink.to(scores.dtype)[None, :, None].expand(q.shape[0], -1, 1)
    probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return torch.einsum("qhk,kd->qhd", probs, keys)  # [Q, H, d]


def dense_picks(q_idx, weights, index_keys, pos):
    """The indexer's choice, dense: `[Q, n]` bool, the TOPK best visible entries."""
    scores = torch.relu(torch.einsum("qhd,nd->qhn", q_idx, index_keys)) * INDEX_DIM**-0.5
    scores = (scores * weights[:, :, None]).sum(1)  # [Q, n]
    seen = torch.arange(index_keys.shape[0], device=DEVICE)[None, :] < ((pos + 1) // RATE)[:, None]
    scores = scores.masked_fill(~seen, float("-inf"))
    picked = torch.zeros_like(seen)
    picked.scatter_(1, scores.topk(min(TOPK, seen.shape[1]), dim=1).indices, True)
    return picked & seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("csa", [False, True], ids=["hca", "csa"])
def test_matches_v4_attention(csa, dtype):
    # an extend over a cached prefix (positions 13..30), a decode (29), a short prompt (0..5)
    prefix, lens = [13, 29, 0], [31, 30, 6]
    gen = torch.Generator().manual_seed(0)
    kv_indptr, kv_indices, num_slots = page_table(lens, PAGE, gen)
    kv = randn(num_slots, D, dtype=dtype, gen=gen)  # [S, d]
    # the entry pools by id, one a page (RATE == PAGE)
    entry = randn(num_slots // PAGE, 2 * D, dtype=dtype, gen=gen)[:, D:]  # [ids, d], strided
    index_key = randn(num_slots // PAGE, INDEX_DIM, dtype=dtype, gen=gen)  # [ids, di]
    new = [n - p for n, p in zip(lens, prefix)]
    T = sum(new)
    qo_indptr = tensor([0] + new).cumsum(0).int()
    positions = torch.cat([torch.arange(p, n) for p, n in zip(prefix, lens)]).to(DEVICE)
    q = randn(T, H, D, dtype=dtype, gen=gen)
    q_idx = randn(T, INDEX_HEADS, INDEX_DIM, gen=gen)
    weights = randn(T, INDEX_HEADS, gen=gen) * INDEX_HEADS**-0.5
    sink = randn(H, gen=gen)

    seqs = query_seqs(qo_indptr, T)
    table = (seqs, kv_indptr, kv_indices, PAGE)
    win = window_indices(positions, *table, WINDOW)
    want = []
    for b, (p0, p1) in enumerate(zip(prefix, lens)):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        slots = expand_pages(kv_indices[int(kv_indptr[b]) :], p1, PAGE)  # [p1]
        picked = None
        if csa:  # the indexer over this sequence's entries
            pos = positions[lo:hi]
            closing = slots[RATE - 1 : p1 // RATE * RATE : RATE]
            index_keys = index_key[entry_of_slot(closing, PAGE, RATE)].float()  # [n, di]
            picked = dense_picks(q_idx[lo:hi], weights[lo:hi], index_keys, pos)
        want.append(dense_v4_attention(q[lo:hi], kv, entry, slots, p0, p1, sink, picked))
    chosen = visible_entries(positions, RATE, max(lens) // RATE)  # [T, n]
    if csa:  # the indexer over every sequence's entries at once
        visible = paged_entry_indices(chosen, *table, RATE)
        scores = indexer_scores(q_idx, weights, index_key, visible)
        chosen = top_entries(scores, TOPK)
    ent = paged_entry_indices(chosen, *table, RATE)
    out = sparse_mqa_attention(q, kv, win, sink, D**-0.5, entry_kv=entry, entry_indices=ent)
    tol = ATTN_TOL[dtype]
    torch.testing.assert_close(out, torch.cat(want), atol=tol, rtol=tol)
