"""`Staging`: a step's host-built integer inputs, carried to the device in one copy.

A step's index arrays (rows, lengths, positions, page-table writes, ...) are packed into
one pinned host buffer, int64 arrays first and int32 arrays after them, each at a 16-byte
boundary (`ALIGN`), and copied into a persistent device buffer with a single non-blocking
transfer; the step's tensors are views of that device buffer. The pinned buffers form a
ring, each guarded by the event of the copy that last read it, so the host never
overwrites memory a transfer still reads and never waits otherwise. The device buffer is
reused by every step: copies and readers are ordered on the one compute stream.
"""

from __future__ import annotations

import numpy as np
import torch

RING = 3  # pinned buffers: the host plans at most two steps ahead of the device
# Each array starts at a multiple of this many bytes. Triton specializes a kernel on whether
# each pointer argument is 16-byte aligned, so views at offsets that move with the batch's
# lengths would meet new variants mid-run, each compiled on the spot (1-2 s, a stalled step).
ALIGN = 16
_TORCH = {np.int64: torch.int64, np.int32: torch.int32}


class Staging:
    """Packs named int64 and int32 arrays; `upload` returns their device views."""

    def __init__(self, device: torch.device, capacity: int = 1 << 19) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        """Buffers of `capacity` bytes (a multiple of ALIGN)."""
        self.capacity = capacity
        self.host = [torch.empty(capacity, dtype=torch.uint8, pin_memory=self.cuda)
                     for _ in range(RING if self.cuda else 1)]
        self.events: list[torch.cuda.Event | None] = [None] * len(self.host)
        self.dev = torch.empty(capacity, dtype=torch.uint8, device=self.device) \
            if self.cuda else None
        self.turn = 0

    def upload(self, i64: dict[str, np.ndarray],
               i32: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Device tensors equal to the 1-D arrays of `i64` (as int64) and `i32` (as int32),
        by name, sent in one host-to-device copy; each starts `ALIGN`-byte aligned."""
        spans, size = {}, 0  # name -> (dtype, byte offset, length)
        for arrays, dtype in ((i64, np.int64), (i32, np.int32)):
            for name, a in arrays.items():
                spans[name] = (dtype, size, len(a))
                size += -(-len(a) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
        if size > self.capacity:
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()  # old buffers idle
            self._alloc(max(size, 2 * self.capacity))
        i = self.turn
        self.turn = (i + 1) % len(self.host)
        if self.events[i] is not None:
            self.events[i].synchronize()  # the copy that last read this buffer is done
        host = self.host[i].numpy()
        for name, a in (i64 | i32).items():
            dtype, start, n = spans[name]
            host[start:start + n * np.dtype(dtype).itemsize].view(dtype)[:] = a
        if not self.cuda:  # the tensors would be the host buffer itself: copy out of it
            src = self.host[i][:size].clone()
        else:
            src = self.dev[:size]
            src.copy_(self.host[i][:size], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.events[i] = event
        return {name: src[start:start + n * np.dtype(dtype).itemsize].view(_TORCH[dtype])
                for name, (dtype, start, n) in spans.items()}
