"""The per-query key lists `sparse_mqa_attention` reads, built in torch from a batch's CSR page
table (`kernels.kv.paging`), vectorized over the batch (no host sync, no loop a sequence).

Query t of sequence b at position p reads two lists, -1 for none:
- its window: the pool slots of positions (p - window, p], oldest first (`window_indices`);
- compressed entries, by entry number: entry w is the one whose window of `rate` tokens
  closes at position (w + 1) * rate - 1; it lives in an entry pool beside the token rows,
  at an id read from the request row's entry table (`entry_indices`) or, where ids follow
  the pages, from the closing token's slot (`paged_entry_indices`).
  Which entries: every one closed by p (`visible_entries`), or the indexer's best-scored of
  those (`top_entries` over `indexer_scores`).
"""

import torch


def query_seqs(qo_indptr: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """`[T]` int64: the sequence of each of a batch's num_tokens new tokens, whose sequence i
    holds tokens qo_indptr[i] .. qo_indptr[i + 1] (`[B + 1]`)."""
    tokens = torch.arange(num_tokens, device=qo_indptr.device)  # [T]
    return torch.searchsorted(qo_indptr[1:].long().contiguous(), tokens, right=True)


def position_slots(positions: torch.Tensor, seqs: torch.Tensor, kv_indptr: torch.Tensor,
                   kv_indices: torch.Tensor, page_size: int) -> torch.Tensor:
    """`[T, K]` int32 pool slots of positions `[T, K]` (negative: none, -1) in the sequences
    seqs `[T]` of the page table (kv_indptr `[B + 1]`, kv_indices page ids, page_size)."""
    valid = positions >= 0
    pos = positions.clamp(min=0)  # [T, K]; none reads the sequence's first page, then drops
    page = kv_indices[kv_indptr[seqs].long()[:, None] + pos // page_size].long()  # [T, K]
    slot = page * page_size + pos % page_size
    return torch.where(valid, slot, -1).to(torch.int32)


def window_indices(positions: torch.Tensor, seqs: torch.Tensor, kv_indptr: torch.Tensor,
                   kv_indices: torch.Tensor, page_size: int, window: int) -> torch.Tensor:
    """`[T, window]` int32: the slots of positions (p - window, p] of each query at positions
    `[T]` (of sequences seqs `[T]`), oldest first, -1 before position 0."""
    offs = torch.arange(1 - window, 1, device=positions.device)  # [window]
    pos = positions[:, None].long() + offs[None, :]  # [T, window]
    return position_slots(pos, seqs, kv_indptr, kv_indices, page_size)


def entry_indices(entries: torch.Tensor, rows: torch.Tensor,
                  req_to_entry: torch.Tensor) -> torch.Tensor:
    """`[T, k]` int32: the ids of entry numbers entries `[T, k]` (-1: none) of the queries'
    request rows `[T]`, read from the entry table `req_to_entry` `[rows, windows]` (window
    w's id at column w)."""
    picked = req_to_entry[rows.long()[:, None], entries.long().clamp(min=0)]  # [T, k]
    return torch.where(entries >= 0, picked, -1).to(torch.int32)


def entry_of_slot(slots: torch.Tensor, page_size: int, rate: int) -> torch.Tensor:
    """The id of the entry whose window closes at pool slots `slots` (any shape, int), when
    ids follow pages: `ceil(page_size / rate)` ids a page, the closing token's offset in
    its page // rate the id within it."""
    per_page = -(-page_size // rate)
    return slots // page_size * per_page + slots % page_size // rate


def paged_entry_indices(entries: torch.Tensor, seqs: torch.Tensor, kv_indptr: torch.Tensor,
                        kv_indices: torch.Tensor, page_size: int, rate: int) -> torch.Tensor:
    """`[T, k]` int32: `entry_indices` where ids follow the page table (`entry_of_slot` of
    the slot of the token closing each entry's window, in the queries' sequences `[T]`)."""
    closing = torch.where(entries >= 0, (entries.long() + 1) * rate - 1, -1)  # [T, k]
    slots = position_slots(closing, seqs, kv_indptr, kv_indices, page_size)  # [T, k]
    ids = entry_of_slot(slots.long(), page_size, rate)
    return torch.where(slots >= 0, ids, -1).to(torch.int32)


def visible_entries(positions: torch.Tensor, rate: int, n: int) -> torch.Tensor:
    """`[T, n]` int64 entry numbers: w where the query at positions `[T]` sees entry w (its
    window closed: (w + 1) * rate <= p + 1), else -1. n: at least the most any query sees,
    (max position + 1) // rate, a host int."""
    w = torch.arange(n, device=positions.device)  # [n]
    return torch.where(w[None, :] < ((positions.long() + 1) // rate)[:, None], w[None, :], -1)


def top_entries(scores: torch.Tensor, k: int) -> torch.Tensor:
    """`[Q, k]` int64 entry numbers: each query's k best of scores `[Q, n]` (`indexer_scores`,
    -inf where not visible), in entry order, then -1 for an invisible one and past n
    (always k wide, so that sequences with different n stack). Entries tied with the k-th
    best score (relu'd scores tie at 0) are taken earliest first, so a query's picks do not
    depend on n (a step's lists are as wide as its longest sequence needs) or on how a top-k
    orders ties."""
    n = scores.shape[1]
    kth = scores.topk(min(k, n), dim=1).values[:, -1:]  # [Q, 1]
    rank = (scores > kth).int() * 2 + (scores == kth).int()  # [Q, n] 2 above, 1 tied, 0
    earlier = torch.arange(n - 1, -1, -1, dtype=torch.int32, device=scores.device)  # [n]
    picked = (rank * n + earlier).topk(min(k, n), dim=1).indices  # [Q, <= k]
    seen = scores.gather(1, picked) > float("-inf")  # [Q, <= k]
    picked = torch.where(seen, picked, n).sort(dim=1).values  # invisible ones (n) last
    picked = picked.masked_fill(picked == n, -1)
    return torch.nn.functional.pad(picked, (0, k - picked.shape[1]), value=-1)
