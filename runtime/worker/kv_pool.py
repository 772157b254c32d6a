"""The KV pool: per-layer K and V tensors indexed by slot, and how many slots fit in memory.

The scheduler owns which slot holds which token; the worker only owns the tensors. Slot 0
is a padding sink: it is never a real token, so batched gathers may point padding at it.
"""

from __future__ import annotations

import torch

GiB = 1 << 30


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token occupies in the pool: 2 (K and V) x layers x kv_heads x head_dim x bytes."""
    return 2 * num_layers * kv_heads * head_dim * dtype.itemsize


def slots_for_memory(free_bytes: int, bytes_per_token: int, mem_fraction: float,
                     reserve_bytes: int) -> int:
    """Slots (padding slot included) that fit in `mem_fraction` of `free_bytes` less a reserve.

    `free_bytes` is measured after the weights are loaded; `reserve_bytes` is kept back for
    activations, logits and sampler temporaries.
    """
    budget = int(free_bytes * mem_fraction) - reserve_bytes
    if budget < 2 * bytes_per_token:
        raise MemoryError(
            f"no room for the KV pool: {free_bytes / GiB:.2f} GiB free x {mem_fraction} "
            f"less a {reserve_bytes / GiB:.2f} GiB reserve leaves {budget / GiB:.2f} GiB, "
            f"and one token needs {bytes_per_token} bytes")
    return budget // bytes_per_token


def cuda_free_bytes(device: torch.device) -> int:
    """Free memory on a CUDA device right now (the allocator's cache counts as used)."""
    free, _total = torch.cuda.mem_get_info(device)
    return free


class KVPool:
    """K and V for every layer: `k[layer]`, `v[layer]` are `[num_slots, kv_heads, head_dim]`."""

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        if num_slots < 2:
            raise ValueError(f"num_slots must be >= 2 (slot 0 is padding), got {num_slots}")
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # zeros, not empty: padded reads of slot 0 (or a stale slot) must stay finite,
        # because a masked score times a NaN value is still NaN
        shape = (num_slots, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim, self.dtype)

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * self.num_slots

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write new tokens' K/V (`[T, kv_heads, head_dim]`) at `slots` (`[T]` int64)."""
        self.k[layer_id].index_copy_(0, slots, k.to(self.dtype))  # [slots, Hkv, D]
        self.v[layer_id].index_copy_(0, slots, v.to(self.dtype))  # [slots, Hkv, D]
