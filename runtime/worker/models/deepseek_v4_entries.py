"""DeepSeek-V4's compressed entries, beside the token rows of the pool: per compression
rate m, a pool of entry rows by id (every layer of that rate its entry, `head_dim` values,
and a CSA layer its indexer key, `index_head_dim`), id 0 a sink that writes of nothing
(padding, a graph's sink row) go to.

Window w of a request (positions `[w * m, (w + 1) * m)`) has one id, by one of two schemes:

- `table` (token-granular slots, which admit no id that is a function of the slot): the
  scheduler hands the ids out with the slot of each window's closing token
  (`runtime.scheduler.entry_ids`) and sends them with the step that closes the window, or
  at a prefix hit's admission; the worker keeps them per request row,
  `req_to_entry[m][row, w]` (`write`), one row more for the sink row;
- `paged` (any page size): the closing token's page and offset,
  `page * ceil(page_size / m) + offset // m` (`kernels.sparse.index_lists.entry_of_slot`).
  With pages a multiple of m that is `page_size / m` ids a page, none unused; a page
  smaller than m (HCA's m = 128 under small pages, or the page size 1 of the contiguous
  and dynamic layouts) holds at most one closing token and gets one id, m / page_size
  times the ids its windows need (sound, not compact).

Page 0 holds the sink slot, so its ids are sinks too in the `paged` scheme.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from kernels.sparse.index_lists import entry_indices, entry_of_slot, paged_entry_indices
from runtime.worker.models.deepseek_v4_arch import CSA, SWA, DeepseekV4Arch
from runtime.worker.staging import Staging


def ids_per_page(page_size: int, rate: int) -> int:
    """Ids a page of the `paged` scheme holds for entries of `rate` tokens."""
    return -(-page_size // rate)


def entry_widths(arch: DeepseekV4Arch, layer_id: int) -> tuple[int, ...]:
    """Values a window's id holds in layer `layer_id`: none (sliding window), its entry
    (HCA), its entry and indexer key (CSA)."""
    kind = arch.layer_types[layer_id]
    if kind == SWA:
        return ()
    return (arch.head_dim, arch.index_head_dim) if kind == CSA else (arch.head_dim,)


def entry_count(num_slots: int, rate: int, page_size: int, table: bool, rows: int) -> int:
    """Ids of a rate's pool, the sink included, over a pool of `num_slots` slots (the sink
    slot included). `table`: one a window the slots hold, plus `rows` (the windows a
    request's own tokens and its locked prefix close exceed its slots / m by one at most,
    so running requests never run short of ids before slots); else `ids_per_page` a page."""
    if table:
        return -(-(num_slots - 1) // rate) + rows + 1
    return -(-num_slots // page_size) * ids_per_page(page_size, rate)


def entry_bytes_per_token(arch: DeepseekV4Arch, itemsize: int, page_size: int = 1,
                          table: bool = True) -> Fraction:
    """Bytes the entry pools take a pool slot: each compressed layer's entry widths, one
    id a `rate` slots (`table`, or pages a multiple of the rate), else `ids_per_page` a
    page."""
    total = Fraction(0)
    for i in range(arch.num_layers):
        rate = arch.rate(i)
        if rate:
            share = (Fraction(1, rate) if table
                     else Fraction(ids_per_page(page_size, rate), page_size))
            total += sum(entry_widths(arch, i)) * itemsize * share
    return total


class EntryStore:
    """The entry pools of a model (`entry[layer]` `[ids, head_dim]`, `idx_key[layer]`
    `[ids, index_head_dim]` for CSA layers, by `allocate`) and, in the `table` scheme, the
    entry tables `req_to_entry[m]` `[rows + 1, windows]` of `rows` request rows, made at
    construction (per-row state, taken before the pool is sized): window w's id at column
    w, the last row the sink row (sink ids)."""

    def __init__(self, arch: DeepseekV4Arch, rows: int, max_context: int, table: bool,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.arch, self.rows, self.table, self.dtype, self.device = (
            arch, rows, table, dtype, device)
        self.rates = sorted({arch.rate(i) for i in range(arch.num_layers)} - {0})
        self.req_to_entry = {m: torch.zeros(rows + 1, max_context // m + 1, dtype=torch.int64,
                                            device=device) for m in self.rates if table}
        self.staging = Staging(torch.device(device), 1 << 12) if table else None  # `write`
        self.counts: dict[int, int] = {}
        self.entry: dict[int, torch.Tensor] = {}
        self.idx_key: dict[int, torch.Tensor] = {}

    @property
    def table_bytes(self) -> int:
        return sum(t.nbytes for t in self.req_to_entry.values())

    def allocate(self, num_slots: int, page_size: int) -> None:
        """The entry pools beside a pool of `num_slots` slots (pages of `page_size` in the
        `paged` scheme): `entry_count` ids a rate."""
        a = self.arch
        self.counts = {m: entry_count(num_slots, m, page_size, self.table, self.rows)
                       for m in self.rates}
        for i in range(a.num_layers):
            widths, n = entry_widths(a, i), self.counts.get(a.rate(i), 0)
            for pools, width in zip((self.entry, self.idx_key), widths):
                pools[i] = torch.zeros(n, width, dtype=self.dtype, device=self.device)

    def pools(self, rate: int) -> list[torch.Tensor]:
        """The entry pools `[ids, width]` of every layer of `rate`."""
        return [pools[i] for pools in (self.entry, self.idx_key) for i in pools
                if self.arch.rate(i) == rate]

    def write(self, writes: list[tuple[int, int, int, list[int]]]) -> None:
        """Set `req_to_entry[rate][row, first + j] = ids[j]` for each (rate, row, first,
        ids) of `writes` (a `BatchPlan.entry_writes`), in one non-blocking copy."""
        arrays = {}
        for m in self.req_to_entry:
            mine = [(row, first, ids) for rate, row, first, ids in writes if rate == m]
            if mine:
                arrays[f"row{m}"] = np.concatenate([[row] * len(ids) for row, _, ids in mine])
                arrays[f"col{m}"] = np.concatenate([np.arange(first, first + len(ids))
                                                    for _, first, ids in mine])
                arrays[f"id{m}"] = np.concatenate([ids for _, _, ids in mine])
        if not arrays:
            return
        d = self.staging.upload(i64=arrays, i32={})
        for m, table in self.req_to_entry.items():
            if f"row{m}" in d:
                table[d[f"row{m}"], d[f"col{m}"]] = d[f"id{m}"]

    def ids(self, rate: int, entries: torch.Tensor, rows: torch.Tensor,
            page_table: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]) -> torch.Tensor:
        """`[T, k]` int32 ids of entry numbers `entries` `[T, k]` (-1: none) of the
        sequences of tokens on request rows `rows` `[T]` (page table: each token's
        sequence, kv_indptr, kv_indices, page size)."""
        if self.table:
            return entry_indices(entries, rows, self.req_to_entry[rate])
        return paged_entry_indices(entries, *page_table, rate)

    def closing_ids(self, rate: int, rows: torch.Tensor, windows: torch.Tensor,
                    slots: torch.Tensor, page_size: int) -> torch.Tensor:
        """`[E]` int64 ids of windows `windows` `[E]` of the requests on rows `rows` `[E]`,
        closed by the tokens at pool slots `slots` `[E]` (pages of `page_size`)."""
        if self.table:
            return self.req_to_entry[rate][rows, windows]
        return entry_of_slot(slots, page_size, rate)
