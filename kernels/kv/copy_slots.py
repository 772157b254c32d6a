"""Copy KV rows between two sets of slot-indexed tensors, every layer in one launch.

A `SlotTensors` is a list of same-shaped "members" `[num_slots, ...]` (one per layer, or
per layer's K and V) addressed as one: a base tensor, each member's offset from it in
words, and the stride between slots in words. The members are separate tensors
(`SlotTensors.of`, the device pool) or the columns of one slot-major tensor
`[num_slots, members, ...]` (`SlotTensors.slot_major`, the host pool: a slot's rows
of every member side by side). `copy_slots(src, dst, src_slots, dst_slots)` copies
`src.tensors[l][src_slots[i]]` to `dst.tensors[l][dst_slots[i]]` for every member `l`.

Either side may live in host memory registered with the device (`cudaHostRegister`):
the kernel then reads or writes it directly over the bus (unified addressing), so a
scattered write-back or load is one launch with no staging buffer and no CPU work.
Rows shorter than `SPAN_BYTES` (a quantized pool's scales) are copied by programs that
span members, so that a slot's rows of every member reach slot-major host memory as
whole contiguous lines: the bus writes partial cache lines to the host far slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TILE_WORDS = 4096  # words one program moves per loop step (16 KiB of int32)
SPAN_BYTES = 256  # shorter rows: one program copies a slot's rows of many members


def _word_dtype(row_bytes: int) -> torch.dtype:
    """The widest integer type whose size divides a row."""
    for dtype in (torch.int32, torch.int16):
        if row_bytes % dtype.itemsize == 0:
            return dtype
    return torch.uint8


@dataclass(frozen=True)
class SlotTensors:
    """Members `tensors` (equal shape and dtype) as one base, per-member word offsets and
    a slot stride, ready for `copy_slots`."""

    tensors: tuple[torch.Tensor, ...]
    base: torch.Tensor  # words of the memory every member lies in
    offsets: torch.Tensor  # [L] int64 word offset of each member from base, on `device`
    row_words: int
    slot_words: int  # words from one slot's row of a member to the next slot's
    align: int  # a power of 2 dividing every row's start, in words

    @staticmethod
    def of(tensors: list[torch.Tensor], device: torch.device) -> SlotTensors:
        """Separate contiguous members; `device` is where the kernel runs (the offsets live
        there)."""
        first = tensors[0]
        for t in tensors:
            assert t.is_contiguous() and t.shape == first.shape and t.dtype == first.dtype, (
                "slot tensors must be contiguous and alike")
        word = _word_dtype(first[0].numel() * first.element_size())
        base = first.view(first.shape[0], -1).view(torch.uint8).view(word)  # [S, row_words]
        starts = [t.data_ptr() - first.data_ptr() for t in tensors]
        assert all(s % word.itemsize == 0 for s in starts), "members must be word-aligned"
        row_words = base.shape[1]
        return SlotTensors._make(tuple(tensors), base, [s // word.itemsize for s in starts],
                                 row_words, row_words, device)

    @staticmethod
    def slot_major(table: torch.Tensor, device: torch.device) -> SlotTensors:
        """The members `table[:, l]` of a contiguous `[num_slots, members, ...]` table."""
        assert table.is_contiguous(), "a slot-major table must be contiguous"
        members = table.shape[1]
        word = _word_dtype(table[0, 0].numel() * table.element_size())
        base = table.view(table.shape[0], -1).view(torch.uint8).view(word)  # [S, L * row]
        row_words = base.shape[1] // members
        return SlotTensors._make(tuple(table.unbind(1)), base,
                                 [m * row_words for m in range(members)], row_words,
                                 base.shape[1], device)

    @staticmethod
    def _make(tensors: tuple, base: torch.Tensor, offsets: list[int], row_words: int,
              slot_words: int, device: torch.device) -> SlotTensors:
        size = base.element_size()
        gcd = math.gcd(row_words, slot_words, base.data_ptr() // size, *offsets)
        align = 1
        while align * 2 * size <= 16 and gcd % (align * 2) == 0:
            align *= 2
        return SlotTensors(tensors, base, torch.tensor(offsets, dtype=torch.int64, device=device),
                           row_words, slot_words, align)


@triton.jit(do_not_specialize=["n"])
def _copy_slots_kernel(
    src_ptr, src_offs_ptr, src_idx_ptr, src_slot_words,
    dst_ptr, dst_offs_ptr, dst_idx_ptr, dst_slot_words, n, members, row_words,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, ALIGN: tl.constexpr,
    SPAN: tl.constexpr, ROW_P2: tl.constexpr,
):
    pid = tl.program_id(0)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    t_mask = t < n
    s = tl.load(src_idx_ptr + t, mask=t_mask, other=0).to(tl.int64)  # [BT]
    d = tl.load(dst_idx_ptr + t, mask=t_mask, other=0).to(tl.int64)  # [BT]
    if SPAN == 1:  # one member per program, its rows tile by tile
        member = tl.program_id(1)
        s_row = tl.multiple_of(tl.load(src_offs_ptr + member) + s * src_slot_words, ALIGN)
        d_row = tl.multiple_of(tl.load(dst_offs_ptr + member) + d * dst_slot_words, ALIGN)
        for w in range(0, row_words, BLOCK_W):
            cols = w + tl.arange(0, BLOCK_W)  # [BW]
            mask = t_mask[:, None] & (cols < row_words)[None, :]  # [BT, BW]
            x = tl.load(src_ptr + s_row[:, None] + cols[None, :], mask=mask)
            tl.store(dst_ptr + d_row[:, None] + cols[None, :], x, mask=mask)
    else:  # SPAN members per program, each row padded to ROW_P2 columns of the tile
        cols = tl.arange(0, BLOCK_W)  # [BW], BW = SPAN * ROW_P2
        member = tl.program_id(1) * SPAN + cols // ROW_P2  # [BW]
        word = cols % ROW_P2  # [BW]
        c_mask = (word < row_words) & (member < members)  # [BW]
        src_col = tl.load(src_offs_ptr + member, mask=c_mask, other=0) + word  # [BW]
        dst_col = tl.load(dst_offs_ptr + member, mask=c_mask, other=0) + word  # [BW]
        mask = t_mask[:, None] & c_mask[None, :]  # [BT, BW]
        x = tl.load(src_ptr + (s * src_slot_words)[:, None] + src_col[None, :], mask=mask)
        tl.store(dst_ptr + (d * dst_slot_words)[:, None] + dst_col[None, :], x, mask=mask)


def copy_slots(src: SlotTensors, dst: SlotTensors, src_slots: torch.Tensor,
               dst_slots: torch.Tensor) -> None:
    """`dst.tensors[l][dst_slots] = src.tensors[l][src_slots]` for every member `l`, in one
    launch on the current stream. src_slots, dst_slots `[n]` integer, on the kernel's device."""
    assert len(src.tensors) == len(dst.tensors) and src.row_words == dst.row_words
    assert src.base.dtype == dst.base.dtype and src_slots.shape == dst_slots.shape
    n, members, row_words = src_slots.shape[0], len(src.tensors), src.row_words
    if n == 0:
        return
    row_p2 = triton.next_power_of_2(row_words)
    span = 1
    if row_words * src.base.element_size() < SPAN_BYTES:
        span = min(triton.next_power_of_2(members), max(1, TILE_WORDS // 4 // row_p2))
    block_w = row_p2 * span if span > 1 else min(row_p2, TILE_WORDS)
    block_t = max(1, TILE_WORDS // block_w)
    grid = (triton.cdiv(n, block_t), triton.cdiv(members, span))
    _copy_slots_kernel[grid](src.base, src.offsets, src_slots, src.slot_words,
                             dst.base, dst.offsets, dst_slots, dst.slot_words,
                             n, members, row_words, BLOCK_T=block_t, BLOCK_W=block_w,
                             ALIGN=min(src.align, dst.align), SPAN=span, ROW_P2=row_p2)


def copy_slots_ref(src: SlotTensors, dst: SlotTensors, src_slots: torch.Tensor,
                   dst_slots: torch.Tensor) -> None:
    """Torch reference of `copy_slots` (slot indices on the tensors' own device)."""
    for s, d in zip(src.tensors, dst.tensors, strict=True):
        d[dst_slots] = s[src_slots]
