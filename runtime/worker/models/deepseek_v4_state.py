"""Where DeepSeek-V4's KV state lives: one row per token and layer in the token-granular
pool (a latent-style pool: `planes=1`, one head of `RowLayout.width` values, each layer's
row as wide as its own layer type needs: `layer_widths`), and the partial blocks in rings
per request row beside it (`deepseek_v4_partial`).

A layer's row for the token at position p holds, at the offsets of `RowLayout`:

- `kv`: the token's K=V row (normed, rotated), which the sliding window reads;
- CSA / HCA layers: `entry`: the compressed entry of the window this token closes, when
  `(p + 1) % rate == 0` (written once that token is computed; unused in other rows);
- CSA layers: `idx_key`: the same for the Lightning Indexer's compressed key.

The compressor inputs (projected kv and gate logits, compressor's and indexer's) are not
in the rows: a request keeps those its next entries read, the tokens since its last
closed window and in CSA the overlap window before them, in its row's ring. So:

- a **prefix hit** (radix cache or paged blocks) reuses the window rows and every entry
  and indexer key of the prefix, never its inputs: the scheduler rounds hits down to a
  multiple of every compression rate (`prefix_rule`: no window is open at the hit's end)
  and computes its last CSA window again (`replay` tokens), whose inputs the next window's
  entry mixes in; those tokens' rows and entries are the prefix's and are not rewritten
  (`V4Step.out_slots` sends them to the padding sink);
- chunked prefill and decode carry the ring from step to step; the token / paged /
  contiguous KV modes read the rows through the page table;
- a **retraction** frees the rows and recomputes them on re-admission (a prefix hit on
  what was cached); a host-tier write-back or swap copies whole rows
  (`KVPool.layer_tensors`), and needs nothing for the partial block: a hit loaded back is
  aligned and replayed like any other.

Still per token: every token keeps, in every compressed layer, a slot for an entry
(a sliding-window layer's row is `head_dim` values, an HCA layer's `2 * head_dim`, a CSA
layer's `2 * head_dim + index_head_dim`), and every token's window row stays in the pool
after it left the window; `bench.studies.dsv4_memory` counts this beside the compressed
design. fp8 / int8 pools are refused: one scale a row would mix kv and entries.

The entry store this wants (not built): token-granular slots admit no entry index that is
a function of the slot, so the ids are handed out. Per compression rate m, a pool of
entry rows (entry and indexer key) of about `num_slots / m` ids, and per request row an
entry table `req_to_entry[row, w]` (window w's id: a page table of page size m), filled
from ids the scheduler hands out with the slot of each window's closing token. What owns
that slot owns its id: radix nodes and paged blocks keep ids beside their slots (none for
tokens closing nothing; a split keeps them aligned), eviction, retraction and release
free both, admission counts both (evicting when either runs short), and the host tier
writes back and loads entry rows with their slots. With blocks a multiple of m, an id is
`block * (block_size / m) + offset // m`: no allocator. `entry_indices` then reads
`req_to_entry`, and `sparse_mqa`'s second view is that pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.sparse.index_lists import (
    entry_indices,
    query_seqs,
    visible_entries,
    window_indices,
)
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.deepseek_v4_arch import CSA, SWA, DeepseekV4Arch
from runtime.worker.models.deepseek_v4_partial import RowStarts

GRAPH_LIST_BYTES = 32 * 2**20  # the widest visible-entry list a decode graph holds


@dataclass(frozen=True)
class RowLayout:
    """Offsets of a layer's parts in its pool row (`(start, width)` each; width 0: absent)."""

    kv: tuple[int, int]
    entry: tuple[int, int] = (0, 0)
    idx_key: tuple[int, int] = (0, 0)

    @property
    def width(self) -> int:
        return max(start + width for start, width in vars(self).values())

    @classmethod
    def of(cls, arch: DeepseekV4Arch, layer_id: int) -> RowLayout:
        kind, d, di = arch.layer_types[layer_id], arch.head_dim, arch.index_head_dim
        if kind == SWA:
            return cls(kv=(0, d))
        if kind == CSA:
            return cls(kv=(0, d), entry=(d, d), idx_key=(2 * d, di))
        return cls(kv=(0, d), entry=(d, d))


def layer_widths(arch: DeepseekV4Arch) -> tuple[int, ...]:
    """Values a token's pool row holds in each layer: that layer's `RowLayout` width."""
    return tuple(RowLayout.of(arch, i).width for i in range(arch.num_layers))


def graph_context(arch: DeepseekV4Arch, rows: int, max_context: int) -> int:
    """The longest sequence decode graphs of up to `rows` rows serve: `max_context`, or
    less where the visible-entry list of the smallest compression rate, built at the
    graphs' full width (`[rows, context // rate]` int32, a few int64 temporaries of that
    shape beside it), would pass `GRAPH_LIST_BYTES`."""
    rates = [r for r in map(arch.rate, range(arch.num_layers)) if r]
    if not rates:
        return max_context
    return min(max_context, GRAPH_LIST_BYTES // (4 * rows) * min(rates))


def part(rows: torch.Tensor, where: tuple[int, int]) -> torch.Tensor:
    """The columns of one part of `rows` `[N, row_width]`: `[N, width]`."""
    return rows[:, where[0] : where[0] + where[1]]


@dataclass
class V4Step:
    """What one step's layers read and write the pool through, built once a step on the
    device (no host read, no loop a sequence): each new token's sequence, request row
    (`rows`), its sequence's first new position (`p0`) and end (`p1`), and the first
    position whose compressor inputs its request computed (`start`, `RowStarts`); the slots
    its new rows go to (`fb.out_slots`, but the padding sink for replayed tokens, whose
    rows the pool holds already: a cached prefix is never rewritten); and its key lists
    (`kernels.sparse.index_lists`): the slots of its window, and of entries by number in
    its own sequence's rows (`entry_slots`). A replayed token's lists name the prefix's
    rows, which hold what it would write."""

    positions: torch.Tensor  # [T] int64
    table: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]  # seq of each token, page table
    rows: torch.Tensor  # [T] int64
    p0: torch.Tensor  # [T] int64
    p1: torch.Tensor  # [T] int64
    start: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64
    window: torch.Tensor  # [T, window] int32 slots, -1 before position 0
    num_seqs: int
    max_len: int  # positions of the longest sequence (a decode graph: its context)
    visible: dict[int, torch.Tensor] = field(default_factory=dict)  # `visible_slots` by rate
    closing: dict[tuple[int, bool], object] = field(default_factory=dict)  # by rate, overlap

    @classmethod
    def of(cls, fb: ForwardBatch, page_table: tuple[torch.Tensor, torch.Tensor],
           starts: RowStarts, window: int) -> V4Step:
        """The step of `fb` over `page_table` (kv_indptr, kv_indices: the batch's own, or a
        decode graph's static copy). Reads device tensors and, on the host, only what a
        decode graph fixes at capture: the token and sequence counts, the page size and
        the longest sequence (`fb.seq_lens_cpu`: a capture batch holds the graph's
        context there), which sizes the visible-entry lists. A decode batch's lengths are
        its positions' (one new token a sequence), so a graph reads no length buffer."""
        seqs = query_seqs(fb.qo_indptr, fb.num_tokens)  # [T]
        table = (seqs, *page_table, fb.page_size)
        p0 = fb.positions if fb.is_decode else fb.prefix_lens.long()  # [B]
        p1 = p0 + 1 if fb.is_decode else fb.seq_lens.long()  # [B]
        start, cached = starts.begin(fb.rows, p0)  # [B] each
        positions = fb.positions
        out_slots = torch.where(positions < cached[seqs], 0, fb.out_slots)
        return cls(positions, table, fb.rows[seqs], p0[seqs], p1[seqs], start[seqs],
                   out_slots, window_indices(positions, *table, window), fb.batch_size,
                   max(fb.seq_lens_cpu, default=0))

    def entry_slots(self, picks: torch.Tensor, rate: int) -> torch.Tensor:
        """`[T, k]` int32: the slots of the entries numbered `picks` `[T, k]` (-1: none) in
        each token's sequence, entries of `rate` tokens."""
        return entry_indices(picks, *self.table, rate)

    def visible_slots(self, rate: int) -> torch.Tensor:
        """`[T, n]` int32: the slots of every entry of `rate` tokens each new token sees
        (-1 past them), built once a step for all layers of that rate."""
        if rate not in self.visible:
            seen = visible_entries(self.positions, rate, self.max_len // rate)  # [T, n]
            self.visible[rate] = self.entry_slots(seen, rate)
        return self.visible[rate]
