"""Attention backends: store the new tokens' K/V in the pool, then attend over the page table.

A backend sees one layer at a time through `forward(layer_id, q, k, v, fb)`; everything it
needs about the batch is in the ForwardBatch (`out_slots`, `kv_indptr`/`kv_indices`, lengths),
so a Triton backend (kernels/store_kv, decode_attention, extend_attention) drops in here.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Protocol

import torch
import torch.nn.functional as F

from kernels.paging import expand_pages
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool


class AttentionBackend(Protocol):
    """What a model layer calls for attention."""

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        """Store `k`, `v` ([T, Hkv, D]) at `fb.out_slots` in layer `layer_id`'s pool, then
        return causal attention of `q` ([T, Hq, D]) over each sequence's KV: [T, Hq, D]."""
        ...


class TorchAttention:
    """Reference backend in plain torch (CPU and GPU): gather K/V by slot, then SDPA.

    Decode batches run as one padded SDPA call (padding points at slot 0 and is masked);
    extend batches loop over sequences, with the query offset by the cached prefix. K/V read
    from the pool are dequantized to q's dtype; like the Triton extend kernel, an extend step
    takes its new tokens' K/V as computed and only the cached prefix from the pool.
    """

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        self.pool.store(layer_id, fb.out_slots, k, v)
        if fb.is_decode:
            return self._decode(layer_id, q, fb)
        return self._extend(layer_id, q, k, v, fb)

    @staticmethod
    def _decode_table(fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded slot table: slots [B, L] (padding -> slot 0) and which entries are real."""
        max_len, ps = max(fb.seq_lens_cpu), fb.page_size
        cols = torch.arange(max_len, device=fb.kv_indices.device)  # [L]
        valid = cols[None, :] < fb.seq_lens[:, None]  # [B, L]
        offs = fb.kv_indptr[:-1, None].long() + cols[None, :] // ps  # [B, L] page entries
        offs = torch.where(valid, offs, 0)  # [B, L], padding reads index 0 (in range)
        slots = fb.kv_indices[offs] * ps + cols[None, :] % ps  # [B, L]
        return torch.where(valid, slots, 0), valid  # [B, L], [B, L]

    def _decode(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        slots, valid = self._decode_table(fb)  # [B, L], [B, L]
        batch, q_heads, head_dim = q.shape
        kv_heads = self.pool.kv_heads
        # the G query heads sharing one KV head ride in SDPA's query-length dim: no K/V copy
        qg = q.reshape(batch, kv_heads, q_heads // kv_heads, head_dim)  # [B, Hkv, G, D]
        kc, vc = self.pool.gather(layer_id, slots, q.dtype)  # [B, L, Hkv, D] x2
        kg, vg = kc.transpose(1, 2), vc.transpose(1, 2)  # [B, Hkv, L, D] x2
        mask = valid[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask)  # [B, Hkv, G, D]
        return out.reshape(batch, q_heads, head_dim)  # [B, Hq, D]

    def _extend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        out = torch.empty_like(q)  # [T, Hq, D]
        group = q.shape[1] // self.pool.kv_heads
        q_starts = accumulate(fb.extend_lens_cpu, initial=0)
        ps = fb.page_size
        page_starts = accumulate((-(-s // ps) for s in fb.seq_lens_cpu), initial=0)
        for q0, p0, n, seq_len, prefix in zip(q_starts, page_starts, fb.extend_lens_cpu,
                                               fb.seq_lens_cpu, fb.prefix_lens_cpu):
            if n == 0:
                continue
            slots = expand_pages(fb.kv_indices[p0:], prefix, ps)  # [P]
            k_pre, v_pre = self.pool.gather(layer_id, slots, q.dtype)  # [P, Hkv, D] x2
            ki = torch.cat([k_pre, k[q0:q0 + n].to(q.dtype)])  # [L, Hkv, D]
            vi = torch.cat([v_pre, v[q0:q0 + n].to(q.dtype)])  # [L, Hkv, D]
            # K/V repeated per query head (not enable_gqa) so fused SDPA kernels stay eligible
            ki = ki.repeat_interleave(group, dim=1)  # [L, Hq, D]
            vi = vi.repeat_interleave(group, dim=1)  # [L, Hq, D]
            qi = q[q0:q0 + n].transpose(0, 1)[None]  # [1, Hq, n, D]
            ki, vi = ki.transpose(0, 1)[None], vi.transpose(0, 1)[None]  # [1, Hq, L, D] x2
            if prefix == 0:
                oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True)  # [1, Hq, n, D]
            else:
                rows = torch.arange(n, device=q.device)[:, None] + prefix  # [n, 1]
                cols = torch.arange(seq_len, device=q.device)[None, :]  # [1, L]
                oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=cols <= rows)
            out[q0:q0 + n] = oi[0].transpose(0, 1)  # [n, Hq, D]
        return out
