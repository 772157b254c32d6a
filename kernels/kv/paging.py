"""The CSR page table shared by the attention kernels: the key tile's slots as the kernels read
them, the launchers' checks of a table, and its slots as plain torch (for references and tests).

A batch's KV lives in a per-layer pool `[num_slots, kv_heads, head_dim]`. Sequence `i` owns the
pages `kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`; its token `t` sits in slot
`kv_indices[kv_indptr[i] + t // page_size] * page_size + t % page_size`.
page_size 1 is the token-level layout, 16 vLLM-style blocks, max_len one region per request.
"""

from collections.abc import Iterator

import torch
import triton
import triton.language as tl


@triton.jit
def tile_slots(kv_indices_ptr, page_base, n0, end, PAGE_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr, MASK: tl.constexpr):
    """Keys n0 .. n0 + BLOCK_N of a sequence whose page ids start at entry page_base of
    kv_indices: (keys `[BLOCK_N]`, which are below `end`, their pool slots int64 `[BLOCK_N]`).
    MASK off: the caller knows every key is below `end`, and the page ids load unmasked."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    if MASK:
        page = tl.load(kv_indices_ptr + page_base + offs_n // PAGE_SIZE, mask=mask_n, other=0)
    else:
        page = tl.load(kv_indices_ptr + page_base + offs_n // PAGE_SIZE)
    slot = page.to(tl.int64) * PAGE_SIZE + offs_n % PAGE_SIZE  # [BLOCK_N]
    return offs_n, mask_n, slot


def check_page_table(kv_indices: torch.Tensor, page_size: int,
                     **int32s: tuple[torch.Tensor, int]) -> None:
    """Check a launch's page table: kv_indices 1-D int32/int64 page ids, page_size >= 1, and
    each `name=(tensor, n)` of `int32s` (kv_indptr, the lengths) an int32 vector of n."""
    for name, (x, n) in int32s.items():
        assert x.shape == (n,) and x.dtype == torch.int32, (
            f"{name} must be int32 [{n}], got {x.dtype} {tuple(x.shape)}"
        )
    assert kv_indices.dim() == 1 and kv_indices.dtype in (torch.int32, torch.int64), (
        f"kv_indices must be 1-D int32/int64, got {kv_indices.dtype} {tuple(kv_indices.shape)}"
    )
    assert page_size >= 1, f"page_size {page_size} must be positive"


def page_slots(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq: int,
    num_tokens: int,
    page_size: int,
) -> torch.Tensor:
    """Pool slots (int64) of the first `num_tokens` tokens of sequence `seq`."""
    start = int(kv_indptr[seq])
    return expand_pages(kv_indices[start:], num_tokens, page_size)


def expand_pages(pages: torch.Tensor, num_tokens: int, page_size: int) -> torch.Tensor:
    """Pool slots (int64) of the first `num_tokens` tokens stored in `pages` (in order)."""
    pages = pages[: -(-num_tokens // page_size)].long()  # [num_pages]
    offsets = torch.arange(page_size, device=pages.device)  # [page_size]
    return (pages[:, None] * page_size + offsets[None, :]).flatten()[:num_tokens]  # [num_tokens]


def padded_slots(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots int64, valid) `[B, max_len]`: each sequence's first `max_len` slots, those past
    its `seq_lens` entry invalid and reading slot 0 (`max_len` at least every entry)."""
    cols = torch.arange(max_len, device=kv_indices.device)  # [L]
    valid = cols[None, :] < seq_lens[:, None]  # [B, L]
    entries = kv_indptr[:-1, None].long() + cols[None, :] // page_size  # [B, L] into kv_indices
    entries = torch.where(valid, entries, 0)  # padding reads entry 0 (in range)
    slots = kv_indices[entries].long() * page_size + cols[None, :] % page_size  # [B, L]
    return torch.where(valid, slots, 0), valid


def extend_runs(
    qo_indptr: torch.Tensor, prefix_lens: torch.Tensor, kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor, page_size: int,
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """For each sequence of an extend batch with new tokens: (lo, hi, slots), its new tokens'
    rows lo:hi and the pool slots int64 `[prefix]` of its cached prefix. Reads the lengths on
    the host, a sync on a GPU."""
    q_starts, page_starts = qo_indptr.tolist(), kv_indptr.tolist()
    for b, prefix in enumerate(prefix_lens.tolist()):
        lo, hi = q_starts[b], q_starts[b + 1]
        if hi > lo:
            yield lo, hi, expand_pages(kv_indices[page_starts[b] :], prefix, page_size)
