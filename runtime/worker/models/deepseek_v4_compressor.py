"""DeepSeek-V4's compressors and Lightning Indexer, over the token rows of the pool
(`deepseek_v4_state`).

A compressor turns each closed window of `rate` tokens into one entry: the softmax over
the window's tokens (per channel) of their gate logits plus a learned bias per window
slot (`ape`) weights their projected kv; the sum is RMS-normed and rotated at the window's
first position. A CSA compressor projects two series per token: the current window's
(`[..., d:]`) and the next one's (`[..., :d]`), so an entry mixes `2 * rate` tokens, its
own window's second series and the previous window's first (none before window 0).

The indexer has its own compressor (at `index_head_dim`) and scores each query against the
compressed keys: `sum_h w_h(x) * relu(q_h . k)`; a query keeps the `index_topk` best of the
entries closed at or before it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.models.causal_lm import RMSNorm
from runtime.worker.models.deepseek_v4_rope import apply_rope
from runtime.worker.models.deepseek_v4_state import SeqStep, part


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

    def store_inputs(self, x: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                     kv_at: tuple[int, int], gate_at: tuple[int, int]) -> None:
        """Write the new tokens' projected kv and gate logits (`x` `[T, hidden]`) into
        their rows at `slots` `[T]`."""
        part(rows, kv_at)[slots] = self.wkv(x).to(rows.dtype)  # [T, width]
        part(rows, gate_at)[slots] = self.wgate(x).to(rows.dtype)  # [T, width]

    def close_windows(self, rows: torch.Tensor, seq: SeqStep, at: dict[str, tuple[int, int]],
                      freqs: tuple[torch.Tensor, float]) -> None:
        """Compute the entries of the windows `seq`'s new tokens close, from the inputs in
        the pool, and write each into the row of the token closing it. `at`: the offsets of
        "kv", "gate" and "entry" in the row."""
        m = self.rate
        first, end = seq.p0 // m, seq.p1 // m  # windows closing at positions in [p0, p1)
        if first == end:
            return
        lo = max(first - 1, 0) * m if self.overlap else first * m
        src = seq.slots[lo : end * m]
        kv = part(rows, at["kv"])[src].float()  # [n' * m, width]
        gate = part(rows, at["gate"])[src].float()
        n_src = src.shape[0] // m
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
        part(rows, at["entry"])[closing] = entries.to(rows.dtype)


def closed_entries(rows: torch.Tensor, seq: SeqStep, rate: int,
                   entry_at: tuple[int, int]) -> torch.Tensor:
    """The entries of every window closed by the end of `seq`'s step: `[p1 // rate, width]`."""
    n = seq.p1 // rate
    return part(rows, entry_at)[seq.slots[rate - 1 : n * rate : rate]]


def visible(positions: torch.Tensor, n: int, rate: int) -> torch.Tensor:
    """`[Q, n]` bool: entry w is visible to the query at position t once its window closed,
    `(w + 1) * rate <= t + 1`."""
    w = torch.arange(n, device=positions.device)
    return w[None, :] < ((positions + 1) // rate)[:, None]


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

    def select(self, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor,
               keys: torch.Tensor, freqs: tuple[torch.Tensor, float]) -> torch.Tensor:
        """`[Q, n]` bool: the entries each query (`x` `[Q, hidden]`, `q_lora` `[Q, rank]` at
        `positions` `[Q]`) attends: its `topk` best-scored visible ones (`keys` `[n, dim]`)."""
        q = self.wq_b(q_lora).view(-1, self.heads, self.dim)  # [Q, h, di]
        q = apply_rope(q, positions, freqs).float()
        scores = torch.relu(torch.einsum("qhd,nd->qhn", q, keys.float())) * self.dim**-0.5
        weights = self.weights_proj(x).float() * self.heads**-0.5  # [Q, h]
        scores = (scores * weights[:, :, None]).sum(dim=1)  # [Q, n]
        seen = visible(positions, keys.shape[0], self.compressor.rate)
        scores = scores.masked_fill(~seen, float("-inf"))
        k = min(self.topk, keys.shape[0])
        picked = torch.zeros_like(seen)
        picked.scatter_(1, scores.topk(k, dim=-1).indices, True)
        return picked & seen
