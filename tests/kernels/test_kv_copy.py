import pytest
import torch

from kernels.kv_copy import SlotTensors, copy_slots, copy_slots_ref
from tests.kernels.cases import DEVICE


def layers(n: int, slots: int, row: tuple, dtype: torch.dtype, gen: torch.Generator):
    """`n` separately allocated layer tensors `[slots, *row]` of random bytes."""
    return [torch.randint(-100, 100, (slots, *row), generator=gen).to(dtype).to(DEVICE)
            for _ in range(n)]


@pytest.mark.parametrize("row,dtype", [
    ((3, 5), torch.float32),  # odd rows of words
    ((2, 7), torch.float16),  # int16 words
    ((1, 3), torch.int8),  # byte words
    ((3,), torch.float32),  # a scale row
    ((5, 1100), torch.int32),  # a row longer than one tile
], ids=str)
def test_scattered_slots_of_every_layer_match_the_reference(row, dtype):
    gen = torch.Generator().manual_seed(len(row) * 31 + row[-1])
    src_slots, dst_slots, n = 19, 23, 13
    src = layers(3, src_slots, row, dtype, gen)
    # the destination is one [L, slots, ...] tensor, as the host pool holds it
    dst = torch.randint(-100, 100, (3, dst_slots, *row), generator=gen).to(dtype).to(DEVICE)
    want = dst.clone()
    s = torch.randperm(src_slots, generator=gen)[:n].to(DEVICE)  # [n]
    d = torch.randperm(dst_slots, generator=gen)[:n].to(DEVICE)  # [n]
    copy_slots_ref(SlotTensors.of(src, DEVICE), SlotTensors.of(list(want), DEVICE), s, d)
    copy_slots(SlotTensors.of(src, DEVICE), SlotTensors.of(list(dst), DEVICE), s, d)
    assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))
    # and back: the destination's slots into fresh ones of the layer tensors
    back = layers(3, src_slots, row, dtype, gen)
    copy_slots(SlotTensors.of(list(dst), DEVICE), SlotTensors.of(back, DEVICE), d, s)
    for b, a in zip(back, src):
        assert torch.equal(b[s].view(torch.uint8), a[s].view(torch.uint8))


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
