"""Where DeepSeek-V4's KV state lives: one row per token and layer in the token-granular
pool (a latent-style pool: `planes=1`, one head of `RowLayout.width` values, each layer's
row as wide as its own layer type needs: `layer_widths`).

A layer's row for the token at position p holds, at the offsets of `RowLayout`:

- `kv`: the token's K=V row (normed, rotated), which the sliding window reads;
- CSA / HCA layers: `comp_kv`, `comp_gate`: the compressor's inputs for this token (its
  projected kv and gate logits; CSA projects two series, so twice `head_dim`);
- `entry`: the compressed entry of the window this token closes, when `(p + 1) % rate == 0`
  (written once that token is computed; unused in other rows);
- CSA layers: `idx_kv`, `idx_gate`, `idx_key`: the same three for the Lightning Indexer.

Every part of the state is a pure function of the tokens' rows: the window ring is the
last `window` rows, the compressed entries sit in the rows of the tokens closing their
windows, and the partial block (tokens after the last closed window, plus the previous
window's overlap half in CSA) is the compressor inputs of those rows. So the state needs no
side storage and follows the pool's slot ownership everywhere:

- a **prefix hit** (radix cache) of P tokens reuses every part the prefix computed: its
  window rows, every entry whose window closed inside it, and its trailing partial block's
  inputs; the first new token closing a window reads them from the pool;
- chunked prefill, the token / paged / contiguous KV modes and decode read the same rows
  through the page table;
- a **retraction** frees the rows and recomputes them on re-admission; a host-tier
  write-back copies whole rows (`KVPool.layer_tensors`), partial block included.

The price of this layout: every token keeps, in every layer, its compressor inputs and a
slot for an entry (a sliding-window layer's row is `head_dim` values, an HCA layer's
`4 * head_dim`, a CSA layer's `6 * head_dim + 5 * index_head_dim`), so the pool holds more
bytes a token than the compressed design needs (`bench.studies.dsv4_memory` counts both).
fp8 / int8 pools are refused: one scale a row would mix kv, gate logits and entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.kv.paging import expand_pages
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.deepseek_v4_arch import CSA, SWA, DeepseekV4Arch


@dataclass(frozen=True)
class RowLayout:
    """Offsets of a layer's parts in its pool row (`(start, width)` each; width 0: absent)."""

    kv: tuple[int, int]
    comp_kv: tuple[int, int] = (0, 0)
    comp_gate: tuple[int, int] = (0, 0)
    entry: tuple[int, int] = (0, 0)
    idx_kv: tuple[int, int] = (0, 0)
    idx_gate: tuple[int, int] = (0, 0)
    idx_key: tuple[int, int] = (0, 0)

    @property
    def width(self) -> int:
        return max(start + width for start, width in vars(self).values())

    @classmethod
    def of(cls, arch: DeepseekV4Arch, layer_id: int) -> RowLayout:
        kind, d, di = arch.layer_types[layer_id], arch.head_dim, arch.index_head_dim
        if kind == SWA:
            return cls(kv=(0, d))
        cw = 2 * d if kind == CSA else d  # CSA's two overlapping series
        parts, start = {}, 0
        names = ["kv", "comp_kv", "comp_gate", "entry"]
        widths = [d, cw, cw, d]
        if kind == CSA:
            names += ["idx_kv", "idx_gate", "idx_key"]
            widths += [2 * di, 2 * di, di]
        for name, width in zip(names, widths):
            parts[name], start = (start, width), start + width
        return cls(**parts)


def layer_widths(arch: DeepseekV4Arch) -> tuple[int, ...]:
    """Values a token's pool row holds in each layer: that layer's `RowLayout` width."""
    return tuple(RowLayout.of(arch, i).width for i in range(arch.num_layers))


def part(rows: torch.Tensor, where: tuple[int, int]) -> torch.Tensor:
    """The columns of one part of `rows` `[N, row_width]`: `[N, width]`."""
    return rows[:, where[0] : where[0] + where[1]]


@dataclass(frozen=True)
class SeqStep:
    """One sequence of a step: new tokens `[q0, q1)` of the batch at positions `[p0, p1)`,
    and the pool slot of every position `[0, p1)`."""

    q0: int
    q1: int
    p0: int
    p1: int
    slots: torch.Tensor  # [p1] int64


def seq_steps(fb: ForwardBatch) -> list[SeqStep]:
    """The sequences of `fb`, their slots read from its page table."""
    out, q0 = [], 0
    starts = fb.kv_indptr.tolist()  # one device read for the step, not one a sequence
    for i, (n, prefix) in enumerate(zip(fb.seq_lens_cpu, fb.prefix_lens_cpu)):
        pages = fb.kv_indices[starts[i] :]
        out.append(SeqStep(q0, q0 + n - prefix, prefix, n, expand_pages(pages, n, fb.page_size)))
        q0 += n - prefix
    return out
