"""Sort the (token, pick) pairs of a routed batch by expert, each expert's run padded to a
multiple of the GEMM's row block, so that every row block of the grouped GEMM holds one
expert's rows. Three Triton launches (the torch reference takes some thirty); both are
shape-static and free of host syncs (CUDA-graph safe)."""

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class MoeAlignment(NamedTuple):
    """Rows of the grouped GEMM. `sorted_ids` `[P]` int32 holds flat pick indices `t * k + j`
    grouped by expert (in pick order within an expert), each group padded with the sentinel
    `T * k` to a multiple of `block_m`; `block_expert` `[P / block_m]` int32 is the expert
    of each row block; `num_padded` `[1]` int32 is the number of rows in use (the blocks
    past it are skipped and their `block_expert` is meaningless)."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_padded: torch.Tensor


def max_padded_rows(num_picks: int, num_experts: int, block_m: int) -> int:
    """The worst-case rows after padding: at most min(E, T * k) experts are hit, each
    wasting at most block_m - 1 rows; rounded up to whole blocks."""
    rows = num_picks + min(num_experts, num_picks) * (block_m - 1)
    return -(-rows // block_m) * block_m


@triton.jit(do_not_specialize=["num_picks"])
def _count_kernel(ids_ptr, chunk_counts_ptr, num_picks, E_POW2: tl.constexpr, BLOCK: tl.constexpr):
    """Picks of each expert in one chunk of BLOCK picks -> chunk_counts [chunk, E_POW2]."""
    chunk = tl.program_id(0)
    idx = chunk * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids_ptr + idx, mask=idx < num_picks, other=E_POW2)  # [BLOCK], E_POW2: no expert
    onehot = e[:, None] == tl.arange(0, E_POW2)[None, :]  # [BLOCK, E_POW2]
    tl.store(chunk_counts_ptr + chunk * E_POW2 + tl.arange(0, E_POW2),
             tl.sum(onehot.to(tl.int32), axis=0))  # fmt: skip


@triton.jit(do_not_specialize=["num_chunks", "num_picks", "num_rows"])
def _offsets_kernel(
    chunk_counts_ptr, chunk_base_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    num_chunks, num_picks, num_rows,
    BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNKS: tl.constexpr, FILL: tl.constexpr,
):  # fmt: skip
    """One program: the padded run of each expert, the first row of each chunk's picks of
    each expert (chunk_base), the sentinel fill, the expert of each row block."""
    experts = tl.arange(0, E_POW2)
    chunks = tl.arange(0, CHUNKS)
    counts = tl.zeros([E_POW2], dtype=tl.int32)
    for c0 in range(0, num_chunks, CHUNKS):
        ptrs = chunk_counts_ptr + (c0 + chunks)[:, None] * E_POW2 + experts[None, :]
        tile = tl.load(ptrs, mask=(c0 + chunks < num_chunks)[:, None], other=0)  # [CHUNKS, E]
        counts += tl.sum(tile, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [E_POW2]
    ends = tl.cumsum(padded, axis=0)  # [E_POW2] end row of each expert's run
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    base = ends - padded  # [E_POW2] first row of the next chunk's picks of each expert
    for c0 in range(0, num_chunks, CHUNKS):
        mask = (c0 + chunks < num_chunks)[:, None]
        ptrs = (c0 + chunks)[:, None] * E_POW2 + experts[None, :]
        tile = tl.load(chunk_counts_ptr + ptrs, mask=mask, other=0)  # [CHUNKS, E_POW2]
        tl.store(chunk_base_ptr + ptrs, base[None, :] + tl.cumsum(tile, axis=0) - tile, mask=mask)
        base += tl.sum(tile, axis=0)
    fill = tl.arange(0, FILL)
    for r0 in range(0, num_rows, FILL):
        tl.store(sorted_ids_ptr + r0 + fill, num_picks, mask=r0 + fill < num_rows)
    for b0 in range(0, num_rows // BLOCK_M, CHUNKS):
        row = (b0 + chunks) * BLOCK_M  # [CHUNKS] first row of each block
        expert = tl.sum((ends[None, :] <= row[:, None]).to(tl.int32), axis=1)  # [CHUNKS]
        tl.store(block_expert_ptr + b0 + chunks, expert, mask=row < num_rows)


@triton.jit(do_not_specialize=["num_picks"])
def _scatter_kernel(
    ids_ptr, chunk_base_ptr, sorted_ids_ptr, num_picks,
    E_POW2: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Each pick of one chunk to its row: the chunk's base for its expert plus the picks of
    the same expert before it in the chunk."""
    chunk = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    idx = chunk * BLOCK + offs
    e = tl.load(ids_ptr + idx, mask=idx < num_picks, other=E_POW2)  # [BLOCK]
    onehot = (e[:, None] == tl.arange(0, E_POW2)[None, :]).to(tl.int32)  # [BLOCK, E_POW2]
    base = tl.load(chunk_base_ptr + chunk * E_POW2 + tl.arange(0, E_POW2))  # [E_POW2]
    earlier = (e[:, None] == e[None, :]) & (offs[None, :] < offs[:, None])  # [BLOCK, BLOCK]
    row = tl.sum(onehot * base[None, :], axis=1) + tl.sum(earlier.to(tl.int32), axis=1)
    tl.store(sorted_ids_ptr + row, idx, mask=idx < num_picks)


def moe_align_block_size(ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """Group the picks `ids` `[T, k]` int32 by expert, in block_m-aligned runs.

    Three launches: count per chunk of picks, one program for the offsets, scatter."""
    assert ids.dtype == torch.int32 and ids.is_contiguous(), "ids must be contiguous int32"
    n, dev = ids.numel(), ids.device
    rows = max_padded_rows(n, num_experts, block_m)
    e_pow2 = triton.next_power_of_2(num_experts)
    block = max(16, min(64, 8192 // e_pow2))  # picks per chunk
    num_chunks = triton.cdiv(n, block)
    chunk_counts = torch.empty(num_chunks, e_pow2, dtype=torch.int32, device=dev)
    chunk_base = torch.empty_like(chunk_counts)  # [chunks, E_POW2]
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=dev)  # [P]
    block_expert = torch.empty(rows // block_m, dtype=torch.int32, device=dev)  # [P / block_m]
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    _count_kernel[(num_chunks,)](ids, chunk_counts, n, E_POW2=e_pow2, BLOCK=block)
    _offsets_kernel[(1,)](
        chunk_counts, chunk_base, sorted_ids, block_expert, num_padded, num_chunks, n, rows,
        BLOCK_M=block_m, E_POW2=e_pow2, CHUNKS=max(1, 4096 // e_pow2), FILL=1024,
    )  # fmt: skip
    _scatter_kernel[(num_chunks,)](ids, chunk_base, sorted_ids, n, E_POW2=e_pow2, BLOCK=block)
    return MoeAlignment(sorted_ids, block_expert, num_padded)


def moe_align_block_size_ref(ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """Torch reference of `moe_align_block_size` (same rows, same order)."""
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
