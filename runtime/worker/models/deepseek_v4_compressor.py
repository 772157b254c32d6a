"""DeepSeek-V4's compressors and Lightning Indexer: their entries in the token rows of the
pool (`deepseek_v4_state`), their inputs of open windows in rings per request row
(`deepseek_v4_partial`).

A compressor turns each closed window of `rate` tokens into one entry: the softmax over
the window's tokens (per channel) of their gate logits plus a learned bias per window
slot (`ape`) weights their projected kv; the sum is RMS-normed and rotated at the window's
first position. A CSA compressor projects two series per token: the current window's
(`[..., d:]`) and the next one's (`[..., :d]`), so an entry mixes `2 * rate` tokens, its
own window's second series and the previous window's first (none before window 0).

The indexer has its own compressor (at `index_head_dim`) and scores each query against the
compressed keys: `sum_h w_h(x) * relu(q_h . k)` (`ops.sparse.indexer_scores`); a query
keeps the `index_topk` best of the entries closed at or before it (`top_entries`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.sparse.index_lists import top_entries
from runtime.worker.models.causal_lm import RMSNorm
from runtime.worker.models.deepseek_v4_partial import (
    InputRing,
    first_window,
    inputs_start,
    ring_length,
)
from runtime.worker.models.deepseek_v4_rope import apply_rope
from runtime.worker.models.deepseek_v4_state import SeqStep, V4Step, part
from runtime.worker.ops import TorchOps


class Compressor(nn.Module):
    """Entries of `dim` values, one per `rate` tokens; `overlap`: the CSA form (two
    series). Parameter names follow the checkpoint (`wkv`, `wgate`, `ape`, `norm`)."""

    def __init__(self, hidden: int, dim: int, rate: int, overlap: bool, eps: float) -> None:
        super().__init__()
        self.dim, self.rate, self.overlap = dim, rate, overlap
        width = 2 * dim if overlap else dim
        self.wkv = nn.Linear(hidden, width, bias=False)
        self.wgate = nn.Linear(hidden, width, bias=False)
        self.ape = nn.Parameter(torch.empty(rate, width))
        self.norm = RMSNorm(dim, eps)
        self.ring: InputRing | None = None  # set by `allocate`

    def allocate(self, rows: int, dtype: torch.dtype, device: torch.device | str) -> None:
        """The ring of each request row's partial block (`deepseek_v4_partial`)."""
        self.ring = InputRing(rows, ring_length(self.rate, self.overlap),
                              self.wkv.out_features, dtype, device)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new tokens' (`x` `[T, hidden]`) projected kv and gate logits `[T, width]`,
        in the ring's dtype (an entry reads every input so rounded, new or kept)."""
        dtype = self.ring.kv.dtype
        return self.wkv(x).to(dtype), self.wgate(x).to(dtype)

    def close_windows(self, kv_new: torch.Tensor, gate_new: torch.Tensor, seq: SeqStep,
                      rows: torch.Tensor, entry_at: tuple[int, int],
                      freqs: tuple[torch.Tensor, float]) -> None:
        """Compute the entries of the windows `seq`'s new tokens (inputs `kv_new`,
        `gate_new` `[Q, width]`) close, from them and the row's ring, and write each into
        the pool row (`entry_at`) of the token closing it; then keep in the ring what the
        next windows read. Windows whose inputs start before `seq.start` are the cached
        prefix's: their entries are in the pool already."""
        m, p0, ring = self.rate, seq.p0, self.ring
        first = max(seq.p0 // m, first_window(seq.start, m, self.overlap))
        end = seq.p1 // m  # windows closing at positions in [p0, p1)
        if first < end:
            lo = inputs_start(first, m, self.overlap)
            kept_kv, kept_gate = ring.read(seq.row, lo, max(lo, p0))  # [p0 - lo, width]
            new = slice(max(lo, p0) - p0, end * m - p0)
            kv = torch.cat([kept_kv, kv_new[new]]).float()  # [n' * m, width]
            gate = torch.cat([kept_gate, gate_new[new]]).float()
            self._entries(kv, gate, first, end, rows, seq, entry_at, freqs)
        keep = max(inputs_start(end, m, self.overlap), p0)
        ring.write(seq.row, keep, kv_new[keep - p0 :], gate_new[keep - p0 :])

    def _entries(self, kv: torch.Tensor, gate: torch.Tensor, first: int, end: int,
                 rows: torch.Tensor, seq: SeqStep, entry_at: tuple[int, int],
                 freqs: tuple[torch.Tensor, float]) -> None:
        """Entries of windows `[first, end)` from their inputs `[n' * m, width]` fp32 (and
        the previous window's, CSA), into the rows of their closing tokens."""
        m = self.rate
        n_src = kv.shape[0] // m
        kv = kv.view(n_src, m, -1)
        gate = gate.view(n_src, m, -1) + self.ape.float()  # [n', m, width]
        if self.overlap:
            d, n = self.dim, end - first
            cur_kv, cur_gate = kv[-n:, :, d:], gate[-n:, :, d:]  # [n, m, d]
            prev_kv = torch.zeros_like(cur_kv)
            prev_gate = torch.full_like(cur_gate, float("-inf"))  # window 0: nothing before
            skip = 1 if first == 0 else 0
            prev_kv[skip:], prev_gate[skip:] = kv[: n_src - 1, :, :d], gate[: n_src - 1, :, :d]
            kv = torch.cat([prev_kv, cur_kv], dim=1)  # [n, 2m, d]
            gate = torch.cat([prev_gate, cur_gate], dim=1)
        pooled = (kv * gate.softmax(dim=1)).sum(dim=1)  # [n, d]
        entries = F.rms_norm(pooled, (self.dim,), self.norm.weight.float(), self.norm.eps)
        starts = torch.arange(first, end, device=rows.device) * m  # [n]
        entries = apply_rope(entries, starts, freqs)  # [n, d]
        closing = seq.slots[starts + m - 1]  # [n]
        part(rows, entry_at)[closing] = entries.to(rows.dtype)


class Indexer(nn.Module):
    """The Lightning Indexer of a CSA layer: query heads from the query LoRA (`wq_b`, the
    `[q_lora_rank -> heads * dim]` projection given), per-head weights from the hidden state
    (`weights_proj`), keys from its compressor."""

    def __init__(self, hidden: int, heads: int, dim: int, rate: int, topk: int, eps: float,
                 wq_b: nn.Module) -> None:
        super().__init__()
        self.heads, self.dim, self.topk = heads, dim, topk
        self.wq_b = wq_b
        self.weights_proj = nn.Linear(hidden, heads, bias=False)
        self.compressor = Compressor(hidden, dim, rate, True, eps)

    def pick(self, x: torch.Tensor, q_lora: torch.Tensor, step: V4Step, rows: torch.Tensor,
             key_at: tuple[int, int], freqs: tuple[torch.Tensor, float],
             ops: TorchOps) -> torch.Tensor:
        """`[T, topk]` int64 entry numbers: the `topk` best-scored entries each new token
        (`x` `[T, hidden]`, `q_lora` `[T, rank]`) sees among its sequence's closed ones,
        whose keys are at `key_at` of the pool `rows`; -1 past the entries it sees. One
        scoring for the step: each token's list names its own sequence's visible keys."""
        q = self.wq_b(q_lora).view(-1, self.heads, self.dim)  # [T, h, di]
        q = apply_rope(q, step.positions, freqs).float()
        weights = self.weights_proj(x).float() * self.heads**-0.5  # [T, h]
        listed = step.visible_slots(self.compressor.rate)  # [T, n]: column w is entry w
        scores = ops.sparse.indexer_scores(q, weights, part(rows, key_at), listed)  # [T, n]
        return top_entries(scores, self.topk)  # [T, topk]
