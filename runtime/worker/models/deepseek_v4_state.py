"""Where DeepSeek-V4's KV state lives: one row per token and layer in the token-granular
pool (a latent-style pool: `planes=1`, one head of `head_dim` values a layer: the token's
K=V row, normed and rotated, which the sliding window reads), the compressed entries in
entry pools beside it by window (`deepseek_v4_entries`), and the partial blocks in rings
per request row (`deepseek_v4_partial`).

Per compression rate m, an entry pool holds one row by id in each layer of that rate: the
window's compressed entry (CSA and HCA layers) and its Lightning Indexer key (CSA). A
window's id is written when the token closing it, at `(p + 1) % m == 0`, is computed, and
comes from the request row's entry table `req_to_entry[m][row, w]` (the token layout,
whose slots admit no id that is a function of the slot: the scheduler hands ids out with
the slot of each closing token, `runtime.scheduler.entry_ids`, and what owns that slot
owns the id: a running request or a radix node; eviction, retraction and release free
both, admission counts both) or from the page table (the paged layout, and at one id a
slot the contiguous and dynamic ones: `page * ceil(page_size / m) + offset // m`, no
allocator). So a token's row holds only its `kv`, and an entry takes its bytes once a
window (once a page where pages are smaller than m), not in every row.

The compressor inputs (projected kv and gate logits, compressor's and indexer's) are not
in the pool: a request keeps those its next entries read, the tokens since its last
closed window and in CSA the overlap window before them, in its row's ring. So:

- a **prefix hit** (radix cache or paged blocks) reuses the window rows and every entry
  and indexer key of the prefix (their ids come with the hit: the radix nodes' or the
  blocks'), never its inputs: the scheduler rounds hits down to a multiple of every
  compression rate (`prefix_rule`: no window is open at the hit's end) and computes its
  last CSA window again (`replay` tokens), whose inputs the next window's entry mixes in;
  those tokens' rows and entries are the prefix's and are not rewritten
  (`V4Step.out_slots` sends them to the padding sink);
- chunked prefill and decode carry the ring from step to step; the token / paged /
  contiguous KV modes read the rows through the page table;
- a **retraction** frees the rows and entries and recomputes them on re-admission (a
  prefix hit on what was cached). The host tier (write-back, swap) copies the rows and
  the entry rows of the windows they close (by the ids their slots hold, or their pages
  give) into host slots and the host ids those hold, and back into fresh ones
  (`HostTier`, `KVTransfer`).

`--kv-dtype fp8` stores the window rows (the pool's `k_scale` beside them) and the
compressed entries (`EntryStore.entry_scale`) as e4m3 codes with one float32 scale a row,
which travel with their rows everywhere a row goes (the host tier copies the pool's and
entry pools' scale tensors by the same slots and ids); the indexer keys and the partial
blocks stay in the model's dtype. int8 and fp8_e4m3 (no scales) are refused, naming
`kv_dtype` (`check_v4_kv_dtype`).

Still per token: every token's window row stays in the pool after it left the window;
`bench.studies.dsv4_memory` counts this beside the compressed design.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.sparse.index_lists import query_seqs, visible_entries, window_indices
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
from runtime.worker.models.deepseek_v4_entries import EntryStore
from runtime.worker.models.deepseek_v4_partial import RowStarts

GRAPH_LIST_BYTES = 32 * 2**20  # the widest visible-entry list a decode graph holds


def graph_context(arch: DeepseekV4Arch, rows: int, max_context: int) -> int:
    """The longest sequence decode graphs of up to `rows` rows serve: `max_context`, or
    less where the visible-entry list of the smallest compression rate, built at the
    graphs' full width (`[rows, context // rate]` int32, a few int64 temporaries of that
    shape beside it), would pass `GRAPH_LIST_BYTES`."""
    rates = [r for r in map(arch.rate, range(arch.num_layers)) if r]
    if not rates:
        return max_context
    return min(max_context, GRAPH_LIST_BYTES // (4 * rows) * min(rates))


@dataclass
class V4Step:
    """What one step's layers read and write the pool through, built once a step on the
    device (no host read, no loop a sequence): each new token's sequence, request row
    (`rows`), its sequence's first new position (`p0`) and end (`p1`), and the first
    position whose compressor inputs its request computed (`start`, `RowStarts`); the slots
    its new rows go to (`fb.out_slots`, but the padding sink for replayed tokens, whose
    rows the pool holds already: a cached prefix is never rewritten); and its key lists
    (`kernels.sparse.index_lists`): the slots of its window, and the ids of entries by
    number in its own sequence (`entry_ids`, from the `entries` store). A replayed token's
    lists name the prefix's rows and entries, which hold what it would write."""

    positions: torch.Tensor  # [T] int64
    table: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]  # seq of each token, page table
    rows: torch.Tensor  # [T] int64
    p0: torch.Tensor  # [T] int64
    p1: torch.Tensor  # [T] int64
    start: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64
    window: torch.Tensor  # [T, window] int32 slots, -1 before position 0
    num_seqs: int
    entries: EntryStore | None
    max_len: int  # positions of the longest sequence (a decode graph: its context)
    visible: dict[int, torch.Tensor] = field(default_factory=dict)  # `visible_ids` by rate
    closing: dict[tuple[int, bool], object] = field(default_factory=dict)  # by rate, overlap

    @classmethod
    def of(cls, fb: ForwardBatch, page_table: tuple[torch.Tensor, torch.Tensor],
           starts: RowStarts | None, window: int, entries: EntryStore | None) -> V4Step:
        """The step of `fb` over `page_table` (kv_indptr, kv_indices: the batch's own, or a
        decode graph's static copy); `starts` and `entries` None for layers that keep
        nothing per request row and no entries (sliding window only: the MTP layer's), whose
        every new token writes its row. Reads device tensors and, on the host, only what a
        decode graph fixes at capture: the token and sequence counts, the page size and
        the longest sequence (`fb.seq_lens_cpu`: a capture batch holds the graph's
        context there), which sizes the visible-entry lists. A decode batch's lengths are
        its positions' (one new token a sequence), so a graph reads no length buffer."""
        seqs = query_seqs(fb.qo_indptr, fb.num_tokens)  # [T]
        table = (seqs, *page_table, fb.page_size)
        p0 = fb.positions if fb.is_decode else fb.prefix_lens.long()  # [B]
        p1 = p0 + 1 if fb.is_decode else fb.seq_lens.long()  # [B]
        if starts is None:
            start, cached = p0, torch.zeros_like(p0)  # [B] each
        else:
            start, cached = starts.begin(fb.rows, p0)  # [B] each
        positions = fb.positions
        out_slots = torch.where(positions < cached[seqs], 0, fb.out_slots)
        return cls(positions, table, fb.rows[seqs], p0[seqs], p1[seqs], start[seqs],
                   out_slots, window_indices(positions, *table, window), fb.batch_size,
                   entries, max(fb.seq_lens_cpu, default=0))

    def entry_ids(self, picks: torch.Tensor, rate: int) -> torch.Tensor:
        """`[T, k]` int32: the entry-pool ids of the entries numbered `picks` `[T, k]` (-1:
        none) in each token's sequence, entries of `rate` tokens."""
        return self.entries.ids(rate, picks, self.rows, self.table)

    def visible_ids(self, rate: int) -> torch.Tensor:
        """`[T, n]` int32: the ids of every entry of `rate` tokens each new token sees (-1
        past them), built once a step for all layers of that rate."""
        if rate not in self.visible:
            seen = visible_entries(self.positions, rate, self.max_len // rate)  # [T, n]
            self.visible[rate] = self.entry_ids(seen, rate)
        return self.visible[rate]
