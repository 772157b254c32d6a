import pytest
import torch

from kernels.kv.copy_slots import SlotTensors, copy_slots, copy_slots_ref
from tests.kernels.cases import DEVICE


def layers(n: int, slots: int, row: tuple, dtype: torch.dtype, gen: torch.Generator):
    """`n` separately allocated layer tensors `[slots, *row]` of random bytes."""
    return [torch.randint(-100, 100, (slots, *row), generator=gen).to(dtype).to(DEVICE)
            for _ in range(n)]


def table_of(dst: torch.Tensor, layout: str) -> SlotTensors:
    """`dst` `[L, slots, ...]` as separate members, or `[slots, L, ...]` slot-major."""
    return SlotTensors.of(list(dst), DEVICE) if layout == "members" else (
        SlotTensors.slot_major(dst, DEVICE))


def members_of(dst: torch.Tensor, layout: str) -> list[torch.Tensor]:
    return list(dst) if layout == "members" else list(dst.unbind(1))


@pytest.mark.parametrize("layout", ["members", "slot-major"])
@pytest.mark.parametrize("row,dtype", [
    ((3, 5), torch.float32),  # odd rows of words (short: programs span members)
    ((2, 7), torch.float16),  # int16 words
    ((1, 3), torch.int8),  # byte words
    ((3,), torch.float32),  # a scale row
    ((5, 1100), torch.int32),  # a row longer than one tile
], ids=str)
def test_scattered_slots_of_every_layer_match_the_reference(row, dtype, layout):
    gen = torch.Generator().manual_seed(len(row) * 31 + row[-1])
    src_slots, dst_slots, n = 19, 23, 13
    src = layers(3, src_slots, row, dtype, gen)
    # the destination is one tensor, as the host pool holds it
    shape = (3, dst_slots, *row) if layout == "members" else (dst_slots, 3, *row)
    dst = torch.randint(-100, 100, shape, generator=gen).to(dtype).to(DEVICE)
    want = dst.clone()
    s = torch.randperm(src_slots, generator=gen)[:n].to(DEVICE)  # [n]
    d = torch.randperm(dst_slots, generator=gen)[:n].to(DEVICE)  # [n]
    copy_slots_ref(SlotTensors.of(src, DEVICE), table_of(want, layout), s, d)
    copy_slots(SlotTensors.of(src, DEVICE), table_of(dst, layout), s, d)
    assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))
    # and back: the destination's slots into fresh ones of the layer tensors
    back = layers(3, src_slots, row, dtype, gen)
    copy_slots(table_of(dst, layout), SlotTensors.of(back, DEVICE), d, s)
    for b, a in zip(back, src):
        assert torch.equal(b[s].view(torch.uint8), a[s].view(torch.uint8))


def test_short_rows_of_more_members_than_one_program_spans():
    """37 members of 60-word rows: programs of 16 members each, the last one partly masked."""
    gen = torch.Generator().manual_seed(5)
    src = layers(37, 9, (60,), torch.float32, gen)
    dst = torch.zeros(11, 37, 60, device=DEVICE)  # [slots, members, row], slot-major
    s, d = torch.tensor([4, 0, 8], device=DEVICE), torch.tensor([10, 3, 1], device=DEVICE)
    copy_slots(SlotTensors.of(src, DEVICE), SlotTensors.slot_major(dst, DEVICE), s, d)
    want = torch.zeros_like(dst)
    want[d] = torch.stack([t[s] for t in src], dim=1)  # [3, 37, 60]
    assert torch.equal(dst, want)


def test_no_slots_copies_nothing():
    gen = torch.Generator().manual_seed(0)
    a, b = layers(2, 4, (8,), torch.float32, gen), layers(2, 4, (8,), torch.float32, gen)
    before = [t.clone() for t in b]
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    copy_slots(SlotTensors.of(a, DEVICE), SlotTensors.of(b, DEVICE), empty, empty)
    assert all(torch.equal(x, y) for x, y in zip(b, before))


def test_alignment_hint_divides_every_row_start():
    gen = torch.Generator().manual_seed(1)
    table = SlotTensors.of(layers(3, 5, (2, 6), torch.float16, gen), DEVICE)  # 24-byte rows
    assert table.base.dtype == torch.int32 and table.row_words == 6
    assert table.align == 2 and all(o % 2 == 0 for o in table.offsets.tolist())
