"""`Staging`: a step's host-built integer inputs, carried to the device in one copy.

A step's index arrays (rows, lengths, positions, page-table writes, ...) are packed into
one pinned host buffer, int64 arrays first and int32 arrays after them, and copied into a
persistent device buffer with a single non-blocking transfer; the step's tensors are
views of that device buffer. The pinned buffers form a ring, each guarded by the event
of the copy that last read it, so the host never overwrites memory a transfer still
reads and never waits otherwise. The device buffer is reused by every step: copies and
readers are ordered on the one compute stream.
"""

from __future__ import annotations

import numpy as np
import torch

RING = 3  # pinned buffers: the host plans at most two steps ahead of the device
_TORCH = {np.int64: torch.int64, np.int32: torch.int32}


class Staging:
    """Packs named int64 and int32 arrays; `upload` returns their device views."""

    def __init__(self, device: torch.device, capacity: int = 1 << 19) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        """Buffers of `capacity` bytes (a multiple of 8)."""
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
        by name, sent in one host-to-device copy."""
        n64, n32 = sum(len(a) for a in i64.values()), sum(len(a) for a in i32.values())
        size = 8 * n64 + 4 * n32
        if size > self.capacity:
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()  # old buffers idle
            self._alloc(-(-max(size, 2 * self.capacity) // 8) * 8)
        i = self.turn
        self.turn = (i + 1) % len(self.host)
        if self.events[i] is not None:
            self.events[i].synchronize()  # the copy that last read this buffer is done
        host = self.host[i]
        spans = {}
        for arrays, dtype, base, end in ((i64, np.int64, 0, 8 * n64),
                                         (i32, np.int32, 8 * n64, size)):
            view = host.numpy()[base:end].view(dtype)
            off = 0
            for name, a in arrays.items():
                view[off:off + len(a)] = a
                spans[name] = (dtype, base + view.itemsize * off, len(a))
                off += len(a)
        if not self.cuda:  # the tensors would be the host buffer itself: copy out of it
            src = host[:size].clone()
        else:
            src = self.dev[:size]
            src.copy_(host[:size], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.events[i] = event
        return {name: src[start:start + n * np.dtype(dtype).itemsize].view(_TORCH[dtype])
                for name, (dtype, start, n) in spans.items()}
