"""`BatchBuilder` turns plans into page tables: token-level, and block-level for `--kv paged`."""

from __future__ import annotations

import torch

from kernels.kv.paging import page_slots
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder

BS = 4  # block size


def blocks(*ids: int, n: int) -> list[int]:
    """Slots of the first n positions of a request holding blocks `ids` in order."""
    return [ids[p // BS] * BS + p % BS for p in range(n)]


def plans(paged: bool) -> list[BatchPlan]:
    """Row 1: a cached prefix of 4 (block 5), then 5 new tokens (blocks 2 and 7); row 0: a
    fresh 7-token prompt over blocks 3, 1, then two decodes with future ids (the second
    starts block 6). Token mode sends the same slots one by one."""
    a, b = blocks(5, 2, 7, n=9), blocks(3, 1, 6, n=9)
    if paged:
        news, prefix = [[2, 7, 3, 1], [], [6]], [(1, [5])]
    else:
        news, prefix = [a[4:] + b[:7], b[7:8], b[8:9]], [(1, a[:4])]
    return [
        BatchPlan(batch_id=0, rows=[1, 0], prefix_lens=[4, 0], extend_lens=[5, 7],
                  input_ids=[9, 8, 7, 6, 1, 2, 3, 4, 5, 6, 7, 8], new_pages=news[0],
                  sample=[True, True], prefix_writes=prefix),
        BatchPlan(batch_id=1, rows=[0], prefix_lens=[7], extend_lens=[1], input_ids=[-1],
                  new_pages=news[1], sample=[True]),
        BatchPlan(batch_id=2, rows=[0], prefix_lens=[8], extend_lens=[1], input_ids=[-1],
                  new_pages=news[2], sample=[True]),
    ]


def test_paged_table_lists_block_ids_and_matches_the_token_slots():
    cpu = torch.device("cpu")
    token, paged = BatchBuilder(4, 16, cpu), BatchBuilder(4, 16, cpu, page_size=BS)
    expected_pages = [[5, 2, 7, 3, 1], [3, 1], [3, 1, 6]]
    for step, (pt, pp, pages) in enumerate(zip(plans(False), plans(True), expected_pages)):
        (ft, st), (fp, sp) = token.build(pt), paged.build(pp)
        assert fp.page_size == BS and fp.kv_indices.tolist() == pages
        assert torch.equal(fp.out_slots, ft.out_slots)
        assert torch.equal(fp.positions, ft.positions)
        for i, n in enumerate(ft.seq_lens_cpu):  # the same slots through either table
            assert torch.equal(page_slots(fp.kv_indptr, fp.kv_indices, i, n, BS),
                               page_slots(ft.kv_indptr, ft.kv_indices, i, n, 1))
        assert st.rows.tolist() == sp.rows.tolist()
        ids = torch.arange(step * 10, step * 10 + len(st.rows))
        token.record(st.rows_dev, ids)
        paged.record(sp.rows_dev, ids)
        if step == 1:  # row 0 sampled id 1 in batch 0 (the second sampled)
            assert fp.input_ids.tolist() == ft.input_ids.tolist() == [1]
    assert fp.out_slots.tolist() == [6 * BS]  # position 8 of row 0: block 6, offset 0
    assert ft.kv_indices.tolist() == blocks(3, 1, 6, n=9)


def test_sample_inputs_list_sampled_rows_positions_and_logprob_targets():
    builder = BatchBuilder(4, 32, torch.device("cpu"))
    plan = BatchPlan(batch_id=0, rows=[2, 3], prefix_lens=[0, 0], extend_lens=[3, 4],
                     input_ids=[5, 6, 7, 1, 2, 3, 4], new_pages=list(range(1, 8)),
                     sample=[False, True], input_logprobs=[(0, 0, [6, 7])])
    fb, inputs = builder.build(plan)
    assert inputs.rows.tolist() == [3] and inputs.positions.tolist() == [4]
    # the sampled token's logits row (last of request 1), then request 0's positions 0, 1
    assert fb.sample_idx.tolist() == [6, 0, 1]
    assert inputs.logprob_targets.tolist() == [6, 7] and inputs.logprob_sizes == (2,)
    assert not fb.is_decode and fb.out_slots.tolist() == list(range(1, 8))


def test_every_tensor_of_a_step_starts_16_byte_aligned():
    # Triton compiles a kernel per pointer alignment: a step whose tensors' alignment moved
    # with the batch's lengths could stall on a compile mid-run.
    builder = BatchBuilder(8, 64, torch.device("cpu"))
    for n in range(1, 6):  # odd and even counts of rows and tokens
        plan = BatchPlan(batch_id=n, rows=list(range(n)), prefix_lens=[0] * n,
                         extend_lens=list(range(1, n + 1)), input_ids=[1] * (n * (n + 1) // 2),
                         new_pages=list(range(n * (n + 1) // 2)), sample=[True] * n)
        fb, si = builder.build(plan)
        tensors = {k: v for k, v in vars(fb).items() if isinstance(v, torch.Tensor)}
        tensors |= {"rows_dev": si.rows_dev, "positions_s": si.positions}
        assert len(tensors) >= 10
        misaligned = [k for k, t in tensors.items() if t.data_ptr() % 16]
        assert not misaligned, (n, misaligned)
