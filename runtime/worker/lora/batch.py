"""`LoraBatch`: which adapter each token of a step runs with, as the segments the LoRA
kernels walk (`kernels.gemm.lora`), and `lora_segments`, which builds them on the host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class LoraBatch:
    """The tokens of a step grouped by adapter slot: slot s owns the token indices
    `order[indptr[s]:indptr[s + 1]]`; tokens of no adapter are in no segment.

    `indptr_cpu` is the host copy (the torch path reads it; None in a CUDA graph, whose
    kernels read `indptr` alone), `max_len` bounds the longest segment (the kernels' grid).
    """

    order: torch.Tensor  # [N] int64 token indices, N <= T
    indptr: torch.Tensor  # [slots + 1] int32
    indptr_cpu: list[int] | None
    max_len: int

    @classmethod
    def static(cls, max_tokens: int, num_slots: int, device: torch.device) -> LoraBatch:
        """Buffers a CUDA graph reads for up to `max_tokens` tokens: no token has an
        adapter until `fill` copies a step's segments in."""
        return cls(torch.zeros(max_tokens, dtype=torch.int64, device=device),
                   torch.zeros(num_slots + 1, dtype=torch.int32, device=device), None,
                   max_tokens)

    def fill(self, batch: LoraBatch | None) -> None:
        """Copy a step's segments into these static buffers (none: no adapter)."""
        if batch is None:
            self.indptr.zero_()
            return
        self.order[:len(batch.order)].copy_(batch.order, non_blocking=True)
        self.indptr.copy_(batch.indptr, non_blocking=True)


def lora_segments(slots: list[int], extend_lens: np.ndarray,
                  num_slots: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """For requests of adapter `slots[i]` (-1: none) with `extend_lens[i]` new tokens each,
    in order: (order [N] int64, indptr [num_slots + 1] int32, longest segment), or None
    when no token has an adapter."""
    tok_slots = np.repeat(np.asarray(slots, dtype=np.int64), extend_lens)  # [T]
    if not len(tok_slots) or tok_slots.max() < 0:
        return None
    assert tok_slots.max() < num_slots, f"adapter slot {tok_slots.max()} of {num_slots}"
    order = np.argsort(tok_slots, kind="stable")  # no adapter (-1) first, then by slot
    counts = np.bincount(tok_slots[tok_slots >= 0], minlength=num_slots)  # [slots]
    indptr = np.zeros(num_slots + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    return order[len(tok_slots) - indptr[-1]:], indptr, int(counts.max())
