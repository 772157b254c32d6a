"""`TokenTable` turns plans into page tables: token-level, and block-level for `--kv paged`."""

from __future__ import annotations

import torch

from kernels.paging import page_slots
from runtime.messages import BatchPlan
from runtime.worker.token_table import TokenTable

BS = 4  # block size


def blocks(*ids: int, n: int) -> list[int]:
    """Slots of the first n positions of a request holding blocks `ids` in order."""
    return [ids[p // BS] * BS + p % BS for p in range(n)]


def plans() -> list[BatchPlan]:
    # row 1: a cached prefix of 6 (blocks 5, 2), then 3 new tokens (block 2, then block 7);
    # row 0: a fresh 5-token prompt over blocks 3, 1, then one decode step with a future id
    a = blocks(5, 2, 7, n=9)
    b = blocks(3, 1, n=6)
    first = BatchPlan(batch_id=0, rows=[1, 0], prefix_lens=[6, 0], extend_lens=[3, 5],
                      input_ids=[9, 8, 7, 1, 2, 3, 4, 5], new_slots=a[6:] + b[:5],
                      sample=[True, True], prefix_writes=[(1, a[:6])])
    second = BatchPlan(batch_id=1, rows=[0], prefix_lens=[5], extend_lens=[1],
                       input_ids=[-1], new_slots=b[5:], sample=[True])
    return [first, second]


def test_paged_table_lists_block_ids_and_expands_to_the_token_slots():
    token, paged = TokenTable(4, 16, torch.device("cpu")), TokenTable(4, 16, torch.device("cpu"),
                                                                     page_size=BS)
    expected_pages = [[5, 2, 7, 3, 1], [3, 1]]
    for plan, pages in zip(plans(), expected_pages):
        ft, fp = token.build(plan), paged.build(plan)
        assert fp.page_size == BS and fp.kv_indices.tolist() == pages
        assert torch.equal(fp.out_slots, ft.out_slots)
        assert torch.equal(fp.positions, ft.positions)
        for i, n in enumerate(ft.seq_lens_cpu):  # the same slots through either table
            assert torch.equal(page_slots(fp.kv_indptr, fp.kv_indices, i, n, BS),
                               page_slots(ft.kv_indptr, ft.kv_indices, i, n, 1))
        ids = torch.arange(plan.batch_id * 10, plan.batch_id * 10 + sum(plan.sample))
        token.record(token.sampled_rows(plan), ids)
        paged.record(paged.sampled_rows(plan), ids)
    assert fp.input_ids.tolist() == [1]  # row 0 sampled id 1 in batch 0 (second sampled)
