"""The CSR page table shared by the attention kernels, as plain torch (for references and tests).

A batch's KV lives in a per-layer pool `[num_slots, kv_heads, head_dim]`. Sequence `i` owns the
pages `kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`; its token `t` sits in slot
`kv_indices[kv_indptr[i] + t // page_size] * page_size + t % page_size`.
page_size 1 is the token-level layout, 16 vLLM-style blocks, max_len one region per request.
"""

import torch


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
