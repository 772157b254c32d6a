"""Attention backends for multi-head latent attention (MLA) over a latent KV pool.

The pool (`KVPool(planes=1)`) holds one row per token and layer, `[num_slots, 1, L + Dr]`:
the latent c_kv, then the rotated rope key. The model calls `forward(layer_id, q, latent,
None, fb)` with absorbed queries q `[T, H, L + Dr]` and the new tokens' rows `[T, 1, L + Dr]`
and gets `[T, H, L]` (before W_UV). Keys are whole rows, values their first L columns.
`TorchMLAAttention` runs the kernels' torch references (CPU, or a GPU reference);
`TritonMLAAttention` the Triton kernels, with the page-table handling (and so the CUDA
graphs) of `TritonAttention`. A quantized (fp8/int8) latent pool keeps one float32 scale
per row (`pool.k_scale`, `[num_slots, 1]`): new rows are quantized as they are stored
(`quantize_ref`, a few shape-static torch ops), the kernels fold the scale in on load, and
an extend reads its own new rows unquantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention.mla_decode import mla_decode, mla_decode_num_splits, mla_decode_ref
from kernels.attention.mla_extend import mla_extend, mla_extend_ref
from kernels.kv.store import quantize_ref
from runtime.worker.attention_torch import TorchAttention, TorchAttentionMeta
from runtime.worker.attention_triton import TritonAttention, TritonAttentionMeta
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool


@dataclass(frozen=True)
class MlaShape:
    """What an MLA attention backend needs of the model."""

    num_heads: int  # this rank's query heads
    kv_lora_rank: int  # L: the latent width; a pool row is L + rope dims
    sm_scale: float


def check_latent_pool(pool: KVPool, mla: MlaShape) -> None:
    if pool.planes != 1 or pool.kv_heads != 1 or pool.head_dim <= mla.kv_lora_rank:
        raise ValueError(
            f"MLA needs a latent pool [slots, 1, > {mla.kv_lora_rank}]; got planes "
            f"{pool.planes}, [slots, {pool.kv_heads}, {pool.head_dim}]"
        )


def store_latent(pool: KVPool, layer_id: int, latent: torch.Tensor, slots: torch.Tensor):
    """Write the new rows `[T, 1, L + Dr]` at `slots` (quantized with their scales in a
    quantized pool); returns the layer's (rows, scales or None)."""
    buf = pool.k[layer_id]  # [slots, 1, L + Dr]
    scale = pool.k_scale[layer_id] if pool.quantized else None  # [slots, 1] f32
    if scale is None:
        buf[slots] = latent.to(buf.dtype)
    else:
        buf[slots], scale[slots] = quantize_ref(latent, buf.dtype)  # [T, 1, L + Dr], [T, 1]
    return buf, scale


class TorchMLAAttention(TorchAttention):
    """`mla_decode_ref` / `mla_extend_ref` on the latent pool, in plain torch."""

    def __init__(self, pool: KVPool, mla: MlaShape) -> None:
        check_latent_pool(pool, mla)
        super().__init__(pool)
        self.mla = mla

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: None, fb: ForwardBatch
    ) -> torch.Tensor:
        meta: TorchAttentionMeta = fb.attn_meta
        buf, kv_scale = store_latent(self.pool, layer_id, k, fb.out_slots)
        lora, scale = self.mla.kv_lora_rank, self.mla.sm_scale
        if fb.is_decode:
            return mla_decode_ref(
                q, buf, fb.kv_indptr, fb.kv_indices, fb.seq_lens, fb.page_size, scale,
                kv_lora_rank=lora, kv_scale=kv_scale, max_seq_len=meta.max_seq_len,
            )  # [B, H, L]  # fmt: skip
        return mla_extend_ref(
            q, k, buf, fb.qo_indptr, fb.prefix_lens, fb.kv_indptr, fb.kv_indices, fb.page_size,
            scale, kv_lora_rank=lora, kv_scale=kv_scale,
        )  # [T, H, L]  # fmt: skip


class TritonMLAAttention(TritonAttention):
    """`mla_decode` (split-KV, head groups) and `mla_extend` on the latent pool; decode
    graphs read the static page table of `TritonAttention`."""

    fuses_rope = False  # the model rotates the rope part of q and of the latent itself

    def __init__(self, pool: KVPool, mla: MlaShape) -> None:
        check_latent_pool(pool, mla)
        super().__init__(pool)
        self.mla = mla

    def _splits(self, batch: int, max_seq_len: int) -> int:
        return mla_decode_num_splits(batch, self.mla.num_heads, max_seq_len)

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: None, fb: ForwardBatch
    ) -> torch.Tensor:
        meta: TritonAttentionMeta = fb.attn_meta
        buf, kv_scale = store_latent(self.pool, layer_id, k, fb.out_slots)
        lora, scale = self.mla.kv_lora_rank, self.mla.sm_scale
        if fb.is_decode:
            return mla_decode(
                q, buf, meta.kv_indptr, meta.kv_indices, meta.seq_lens, fb.page_size, scale,
                kv_lora_rank=lora, kv_scale=kv_scale, num_splits=meta.num_splits,
            )  # [B, H, L]  # fmt: skip
        return mla_extend(
            q, k, buf, fb.qo_indptr, fb.prefix_lens, meta.kv_indptr, meta.kv_indices,
            fb.page_size, scale, kv_lora_rank=lora, kv_scale=kv_scale,
            max_new_len=meta.max_new_len,
        )  # [T, H, L]  # fmt: skip
