"""Copy KV rows between two sets of slot-indexed tensors, every layer in one launch.

A `SlotTensors` is a list of same-shaped tensors `[num_slots, ...]` (one per layer, or per
layer's K and V) addressed as one: a base tensor, each member's offset from it in words,
and the slot stride in words. `copy_slots(src, dst, src_slots, dst_slots)` copies
`src.tensors[l][src_slots[i]]` to `dst.tensors[l][dst_slots[i]]` for every member `l`.

Either side may live in host memory registered with the device (`cudaHostRegister`):
the kernel then reads or writes it directly over the bus (unified addressing), so a
scattered write-back or load is one launch with no staging buffer and no CPU work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TILE_WORDS = 4096  # words one program moves per loop step (16 KiB of int32)


def _word_dtype(row_bytes: int) -> torch.dtype:
    """The widest integer type whose size divides a row."""
    for dtype in (torch.int32, torch.int16):
        if row_bytes % dtype.itemsize == 0:
            return dtype
    return torch.uint8


@dataclass(frozen=True)
class SlotTensors:
    """`tensors` (contiguous, equal shape and dtype) as one base, per-member word offsets
    and a slot stride, ready for `copy_slots`."""

    tensors: tuple[torch.Tensor, ...]
    base: torch.Tensor  # [num_slots, row_words] words of tensors[0]
    offsets: torch.Tensor  # [L] int64 word offset of each member from base, on `device`
    row_words: int
    align: int  # a power of 2 dividing every row's start, in words

    @staticmethod
    def of(tensors: list[torch.Tensor], device: torch.device) -> SlotTensors:
        """Describe `tensors`; `device` is where the kernel runs (the offsets live there)."""
        first = tensors[0]
        for t in tensors:
            assert t.is_contiguous() and t.shape == first.shape and t.dtype == first.dtype, (
                "slot tensors must be contiguous and alike")
        row_bytes = first[0].numel() * first.element_size()
        word = _word_dtype(row_bytes)
        size = word.itemsize
        base = first.view(first.shape[0], -1).view(torch.uint8).view(word)  # [S, row_words]
        starts = [t.data_ptr() - first.data_ptr() for t in tensors]
        assert all(s % size == 0 for s in starts), "members must be word-aligned"
        offsets = [s // size for s in starts]
        row_words = row_bytes // size
        gcd = math.gcd(row_words, first.data_ptr() // size, *offsets)
        align = 1
        while align * 2 * size <= 16 and gcd % (align * 2) == 0:
            align *= 2
        return SlotTensors(tuple(tensors), base,
                           torch.tensor(offsets, dtype=torch.int64, device=device),
                           row_words, align)


@triton.jit(do_not_specialize=["n"])
def _copy_slots_kernel(
    src_ptr, src_offs_ptr, src_idx_ptr, dst_ptr, dst_offs_ptr, dst_idx_ptr, n, row_words,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, ALIGN: tl.constexpr,
):
    pid = tl.program_id(0)
    member = tl.program_id(1)
    src_base = tl.load(src_offs_ptr + member)
    dst_base = tl.load(dst_offs_ptr + member)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    t_mask = t < n
    s = tl.load(src_idx_ptr + t, mask=t_mask, other=0).to(tl.int64)  # [BT]
    d = tl.load(dst_idx_ptr + t, mask=t_mask, other=0).to(tl.int64)  # [BT]
    s_row = tl.multiple_of(src_base + s * row_words, ALIGN)  # [BT]
    d_row = tl.multiple_of(dst_base + d * row_words, ALIGN)  # [BT]
    for w in range(0, row_words, BLOCK_W):
        cols = w + tl.arange(0, BLOCK_W)  # [BW]
        mask = t_mask[:, None] & (cols < row_words)[None, :]  # [BT, BW]
        x = tl.load(src_ptr + s_row[:, None] + cols[None, :], mask=mask)
        tl.store(dst_ptr + d_row[:, None] + cols[None, :], x, mask=mask)


def copy_slots(src: SlotTensors, dst: SlotTensors, src_slots: torch.Tensor,
               dst_slots: torch.Tensor) -> None:
    """`dst.tensors[l][dst_slots] = src.tensors[l][src_slots]` for every member `l`, in one
    launch on the current stream. src_slots, dst_slots `[n]` integer, on the kernel's device."""
    assert len(src.tensors) == len(dst.tensors) and src.row_words == dst.row_words
    assert src.base.dtype == dst.base.dtype and src_slots.shape == dst_slots.shape
    n = src_slots.shape[0]
    if n == 0:
        return
    block_w = min(triton.next_power_of_2(src.row_words), TILE_WORDS)
    block_t = max(1, TILE_WORDS // block_w)
    grid = (triton.cdiv(n, block_t), len(src.tensors))
    _copy_slots_kernel[grid](src.base, src.offsets, src_slots, dst.base, dst.offsets, dst_slots,
                             n, src.row_words, BLOCK_T=block_t, BLOCK_W=block_w,
                             ALIGN=min(src.align, dst.align))


def copy_slots_ref(src: SlotTensors, dst: SlotTensors, src_slots: torch.Tensor,
                   dst_slots: torch.Tensor) -> None:
    """Torch reference of `copy_slots` (slot indices on the tensors' own device)."""
    for s, d in zip(src.tensors, dst.tensors, strict=True):
        d[dst_slots] = s[src_slots]
