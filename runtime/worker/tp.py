"""`TPGroup`: this worker's place in a tensor-parallel group, and the collectives the model
needs (all-reduce of row-parallel outputs, all-gather of vocab-parallel logits).

With `--tp N` the server runs N worker processes, rank r on `cuda:r` (NCCL) or on the CPU
(gloo), joined through a file store under the run's ipc directory, or across hosts
(`--nnodes`) through a TCP store at `--dist-init-addr`. A group of one makes every
collective a no-op, so the single-worker path runs the same model code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """Rank and size of this worker in its tensor-parallel group."""

    rank: int = 0
    size: int = 1

    def shard(self, total: int, what: str) -> int:
        """This rank's share of `total` (heads, columns, vocab rows); it must divide evenly."""
        if total % self.size:
            raise ValueError(f"--tp {self.size} does not divide {what} ({total})")
        return total // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the group, in place."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` [..., n] along the last dim: [..., size * n]."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]  # size x [..., n]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)  # [..., size * n]

    def min_int(self, value: int) -> int:
        """The smallest `value` over the group (every rank must call it)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64,
                         device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


def init_tp(rank: int, size: int, device: torch.device, init_method: str) -> TPGroup:
    """Join the group at `init_method` (`file://...` or `tcp://host:port`): NCCL on CUDA
    (NVLink multicast off), gloo on the CPU."""
    if size == 1:
        return TPGroup()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=size, **kwargs)
    return TPGroup(rank, size)
