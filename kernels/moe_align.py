"""Sort the (token, pick) pairs of a routed batch by expert, each expert's run padded to a
multiple of the GEMM's row block, so that every row block of the grouped GEMM holds one
expert's rows. Torch ops only, shape-static and free of host syncs (CUDA-graph safe)."""

from typing import NamedTuple

import torch


class MoeAlignment(NamedTuple):
    """Rows of the grouped GEMM. `sorted_ids` `[P]` int32 holds flat pick indices `t * k + j`
    grouped by expert, each group padded with the sentinel `T * k` to a multiple of
    `block_m`; `block_expert` `[P / block_m]` int32 is the expert of each row block;
    `num_padded` `[1]` int32 is the number of rows in use (blocks past it are skipped)."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_padded: torch.Tensor


def max_padded_rows(num_picks: int, num_experts: int, block_m: int) -> int:
    """The worst-case rows after padding: at most min(E, T * k) experts are hit, each
    wasting at most block_m - 1 rows; rounded up to whole blocks."""
    rows = num_picks + min(num_experts, num_picks) * (block_m - 1)
    return -(-rows // block_m) * block_m


def moe_align_block_size(ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """Group the picks `ids` `[T, k]` by expert, in block_m-aligned runs (see MoeAlignment)."""
    flat = ids.flatten().long()  # [N], N = T * k
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # [E] picks per expert
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    ends = padded.cumsum(0)  # [E] end row of each expert's run
    order = torch.sort(flat, stable=True).indices  # [N] picks grouped by expert
    expert = flat[order]  # [N]
    rank = torch.arange(n, device=ids.device) - (counts.cumsum(0) - counts)[expert]  # [N]
    dest = (ends - padded)[expert] + rank  # [N] row of each pick
    rows = max_padded_rows(n, num_experts, block_m)
    sorted_ids = torch.full((rows,), n, dtype=torch.int32, device=ids.device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))  # [P]
    block_start = torch.arange(0, rows, block_m, device=ids.device)  # [P / block_m]
    block_expert = torch.searchsorted(ends, block_start, right=True).to(torch.int32)
    return MoeAlignment(sorted_ids, block_expert, ends[-1:].to(torch.int32))
