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

`kv_dtype` "fp8" (`V4_KV_DTYPES`) stores the entries as the pool stores the window rows:
float8_e4m3fn codes with one float32 scale an id (`entry_scale[layer]` `[ids, 1]`, written
with the entry by `kernels.kv.store.store_rows`, read by the sparse attention). The indexer
keys stay in the model's dtype: only their scores' order matters, and they are a fifth of
an entry's bytes at the released shapes (`index_head_dim` 128 against `head_dim` 512).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from kernels.sparse.index_lists import entry_indices, entry_of_slot, paged_entry_indices
from runtime.worker.kv_pool import (
    SCALE_DTYPE,
    kv_bytes_per_token,
    kv_dtype_scaled,
    kv_storage_dtype,
)
from runtime.worker.models.deepseek_v4_arch import CSA, SWA, DeepseekV4Arch
from runtime.worker.staging import Staging

V4_KV_DTYPES = ("auto", "fp8")  # the kv dtypes of DeepSeek-V4's pools: its rows and entries


def check_v4_kv_dtype(kv_dtype: str) -> None:
    """Refuse a `kv_dtype` DeepSeek-V4's pools do not store, naming the field."""
    if kv_dtype not in V4_KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r}: deepseek_v4 stores its KV as 'auto' (the "
                         "model's dtype) or 'fp8' (e4m3 rows, a float32 scale a row)")


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


def id_bytes(arch: DeepseekV4Arch, layer_id: int, dtype: torch.dtype,
             kv_dtype: str = "auto") -> int:
    """Bytes an id holds in layer `layer_id`'s entry pools: its entry (in `kv_dtype`'s
    storage, with its scale under "fp8") and a CSA layer's indexer key (in `dtype`)."""
    widths = entry_widths(arch, layer_id)
    if not widths:
        return 0
    entry = kv_bytes_per_token(1, 1, widths[0], kv_storage_dtype(kv_dtype, dtype), planes=1,
                               scaled=kv_dtype_scaled(kv_dtype))
    return entry + sum(widths[1:]) * dtype.itemsize


def entry_bytes_per_token(arch: DeepseekV4Arch, dtype: torch.dtype, page_size: int = 1,
                          table: bool = True, kv_dtype: str = "auto") -> Fraction:
    """Bytes the entry pools take a pool slot: each compressed layer's `id_bytes`, one id
    a `rate` slots (`table`, or pages a multiple of the rate), else `ids_per_page` a
    page."""
    total = Fraction(0)
    for i in range(arch.num_layers):
        rate = arch.rate(i)
        if rate:
            share = (Fraction(1, rate) if table
                     else Fraction(ids_per_page(page_size, rate), page_size))
            total += id_bytes(arch, i, dtype, kv_dtype) * share
    return total


def row_bytes_per_token(arch: DeepseekV4Arch, dtype: torch.dtype,
                        kv_dtype: str = "auto") -> int:
    """Bytes of a token's K=V rows, one a layer (with its scale under "fp8")."""
    return kv_bytes_per_token(arch.num_layers, 1, arch.head_dim,
                              kv_storage_dtype(kv_dtype, dtype), planes=1,
                              scaled=kv_dtype_scaled(kv_dtype))


def v4_bytes_per_token(arch: DeepseekV4Arch, dtype: torch.dtype, page_size: int = 1,
                       table: bool = True, kv_dtype: str = "auto") -> int:
    """Bytes a pool slot costs DeepSeek-V4 (what the runner's `kv_bytes_per_token`
    counts): its K=V rows and its share of the entry pools, rounded up."""
    return row_bytes_per_token(arch, dtype, kv_dtype) + math.ceil(
        entry_bytes_per_token(arch, dtype, page_size, table, kv_dtype))


class EntryStore:
    """The entry pools of a model (`entry[layer]` `[ids, head_dim]`, `idx_key[layer]`
    `[ids, index_head_dim]` for CSA layers, and under "fp8" `entry_scale[layer]` `[ids, 1]`
    float32, by `allocate`) and, in the `table` scheme, the
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
        self.entry_scale: dict[int, torch.Tensor] = {}

    @property
    def table_bytes(self) -> int:
        return sum(t.nbytes for t in self.req_to_entry.values())

    def allocate(self, num_slots: int, page_size: int, kv_dtype: str = "auto") -> None:
        """The entry pools beside a pool of `num_slots` slots (pages of `page_size` in the
        `paged` scheme): `entry_count` ids a rate, entries in `kv_dtype`'s storage (ones
        for scales: an unwritten id reads as zeros)."""
        check_v4_kv_dtype(kv_dtype)
        a = self.arch
        self.counts = {m: entry_count(num_slots, m, page_size, self.table, self.rows)
                       for m in self.rates}
        dtypes = (kv_storage_dtype(kv_dtype, self.dtype), self.dtype)
        for i in range(a.num_layers):
            widths, n = entry_widths(a, i), self.counts.get(a.rate(i), 0)
            for pools, width, dtype in zip((self.entry, self.idx_key), widths, dtypes):
                pools[i] = torch.zeros(n, width, dtype=dtype, device=self.device)
            if widths and kv_dtype_scaled(kv_dtype):
                self.entry_scale[i] = torch.ones(n, 1, dtype=SCALE_DTYPE, device=self.device)

    def pools(self, rate: int) -> list[torch.Tensor]:
        """The entry pools `[ids, width]` (and scales `[ids, 1]`) of every layer of `rate`:
        what the host tier copies by id."""
        return [pools[i] for pools in (self.entry, self.idx_key, self.entry_scale)
                for i in pools if self.arch.rate(i) == rate]

    def scale(self, layer_id: int) -> torch.Tensor | None:
        """`[ids]` float32: the scales of layer `layer_id`'s entries; None unquantized."""
        scales = self.entry_scale.get(layer_id)
        return None if scales is None else scales.view(-1)

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
