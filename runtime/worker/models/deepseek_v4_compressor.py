"""DeepSeek-V4's compressors and Lightning Indexer: their entries in the entry pools by
window id (`deepseek_v4_entries`), their inputs of open windows in rings per request row
(`deepseek_v4_partial`).

A compressor turns each closed window of `rate` tokens into one entry: the softmax over
the window's tokens (per channel) of their gate logits plus a learned bias per window
slot (`ape`) weights their projected kv; the sum is RMS-normed and rotated at the window's
first position. A CSA compressor projects two series per token: the current window's
(`[..., d:]`) and the next one's (`[..., :d]`), so an entry mixes `2 * rate` tokens, its
own window's second series and the previous window's first (none before window 0). The
step's windows are pooled all at once (`ops.sparse.window_pool` over the lists of
`deepseek_v4_windows`).

The indexer has its own compressor (at `index_head_dim`) and scores each query against the
compressed keys: `sum_h w_h(x) * relu(q_h . k)` (`ops.sparse.indexer_scores`); a query
keeps the `index_topk` best of the entries closed at or before it (`top_entries`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.kv.store import store_rows
from kernels.sparse.index_lists import top_entries
from runtime.worker.models.causal_lm import RMSNorm
from runtime.worker.models.deepseek_v4_partial import InputRing, ring_length
from runtime.worker.models.deepseek_v4_rope import apply_rope
from runtime.worker.models.deepseek_v4_state import V4Step
from runtime.worker.models.deepseek_v4_windows import Closing
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

    def allocate(self, rows: int, dtype: torch.dtype, device: torch.device | str,
                 drafts: int = 0) -> None:
        """The ring of each request row's partial block (`deepseek_v4_partial`), with room
        for verify steps of up to `drafts` drafts."""
        self.ring = InputRing(rows, ring_length(self.rate, self.overlap, drafts),
                              self.wkv.out_features, dtype, device)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new tokens' (`x` `[T, hidden]`) projected kv and gate logits `[T, width]`,
        in the ring's dtype (an entry reads every input so rounded, new or kept)."""
        dtype = self.ring.kv.dtype
        return self.wkv(x).to(dtype), self.wgate(x).to(dtype)

    def close_windows(self, kv_new: torch.Tensor, gate_new: torch.Tensor, closing: Closing,
                      pool: torch.Tensor, freqs: tuple[torch.Tensor, float], ops: TorchOps,
                      scale: torch.Tensor | None = None) -> None:
        """Compute the entries of the windows the step's new tokens (inputs `kv_new`,
        `gate_new` `[T, width]`) close (`closing`), from them and the rows' rings, and
        write each into the entry `pool` `[ids, dim]` at its window's id (e4m3 codes with
        `scale` `[ids]` in an fp8 pool); then keep in the rings what the next windows
        read."""
        series, d, ring, T = 1 + self.overlap, self.dim, self.ring, kv_new.shape[0]
        kept_kv, kept_gate = ring.cells()  # [cells, width] each
        pooled = ops.sparse.window_pool(
            kv_new.view(T, series, d), gate_new.view(T, series, d),
            kept_kv.view(-1, series, d), kept_gate.view(-1, series, d), closing.sources,
            closing.series, self.ape.float().view(self.rate, series, d))  # [E, d] fp32
        entries = F.rms_norm(pooled, (d,), self.norm.weight.float(), self.norm.eps)
        entries = apply_rope(entries, closing.starts, freqs)  # [E, d]
        store_rows(entries, pool, closing.ids, scale)
        kept_kv[closing.cells] = kv_new
        kept_gate[closing.cells] = gate_new


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

    def pick(self, x: torch.Tensor, q_lora: torch.Tensor, step: V4Step, keys: torch.Tensor,
             freqs: tuple[torch.Tensor, float], ops: TorchOps) -> torch.Tensor:
        """`[T, topk]` int64 entry numbers: the `topk` best-scored entries each new token
        (`x` `[T, hidden]`, `q_lora` `[T, rank]`) sees among its sequence's closed ones,
        whose keys are in the pool `keys` `[ids, dim]` by id; -1 past the entries it sees.
        One scoring for the step: each token's list names its own sequence's visible keys."""
        q = self.wq_b(q_lora).view(-1, self.heads, self.dim)  # [T, h, di]
        q = apply_rope(q, step.positions, freqs).float()
        weights = self.weights_proj(x).float() * self.heads**-0.5  # [T, h]
        listed = step.visible_ids(self.compressor.rate)  # [T, n]: column w is entry w
        scores = ops.sparse.indexer_scores(q, weights, keys, listed)  # [T, n]
        return top_entries(scores, self.topk)  # [T, topk]
