"""Gather each sequence's page ids out of the per-row page table into one CSR list.

Sequence `i` of a batch is bound to table row `rows[i]` and spans `num_pages[i]` pages;
`kv_indices[kv_indptr[i] + j] = req_to_page[rows[i], j]` for j < num_pages[i]. One
program per sequence, so a decode step builds its page list in a single launch.
"""

import torch
import triton
import triton.language as tl

BLOCK = 512


@triton.jit
def _gather_pages_kernel(
    table_ptr, rows_ptr, num_pages_ptr, indptr_ptr, out_ptr, stride_t, BLOCK: tl.constexpr
):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i).to(tl.int64)
    n = tl.load(num_pages_ptr + i)
    start = tl.load(indptr_ptr + i).to(tl.int64)
    for j in range(0, n, BLOCK):
        offs = j + tl.arange(0, BLOCK)
        mask = offs < n
        pages = tl.load(table_ptr + row * stride_t + offs, mask=mask)
        tl.store(out_ptr + start + offs, pages, mask=mask)


def gather_pages(req_to_page: torch.Tensor, rows: torch.Tensor, num_pages: torch.Tensor,
                 kv_indptr: torch.Tensor, total: int) -> torch.Tensor:
    """Page ids of every sequence, concatenated: `[total]` with `total >= sum(num_pages)`
    (entries past the sum are not written).

    req_to_page `[R, M]` (row stride any, unit column stride), rows `[B]`, num_pages `[B]`,
    kv_indptr `[B+1]` or `[B]` (each sequence's start in the output).
    """
    assert req_to_page.dim() == 2 and req_to_page.stride(1) == 1, "table must be [R, M]"
    assert rows.shape == num_pages.shape and kv_indptr.shape[0] >= rows.shape[0], (
        rows.shape, num_pages.shape, kv_indptr.shape)
    out = torch.empty(total, dtype=req_to_page.dtype, device=req_to_page.device)
    if rows.shape[0] > 0 and total > 0:
        _gather_pages_kernel[(rows.shape[0],)](
            req_to_page, rows, num_pages, kv_indptr, out, req_to_page.stride(0), BLOCK=BLOCK
        )  # fmt: skip
    return out


def gather_pages_ref(req_to_page: torch.Tensor, rows: torch.Tensor, num_pages: torch.Tensor,
                     kv_indptr: torch.Tensor, total: int) -> torch.Tensor:
    """Torch reference of `gather_pages` (no host sync: `total` is given; entries past
    `sum(num_pages)` are 0)."""
    out = torch.zeros(total, dtype=req_to_page.dtype, device=req_to_page.device)  # [P]
    if rows.shape[0] == 0 or total == 0:
        return out
    starts = kv_indptr[:rows.shape[0]].long()  # [B]
    ends = starts + num_pages  # [B]
    p = torch.arange(total, device=rows.device)  # [P]
    seq = torch.searchsorted(ends, p, right=True).clamp(max=rows.shape[0] - 1)  # [P]
    page = (p - starts[seq]).clamp(0, req_to_page.shape[1] - 1)  # [P]
    return torch.where(p < ends[seq], req_to_page[rows[seq], page], out)  # [P]
