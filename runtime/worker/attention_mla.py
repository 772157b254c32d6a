"""Attention backends for multi-head latent attention (MLA) over a latent KV pool.

The pool (`KVPool(planes=1)`) holds one row per token and layer, `[num_slots, 1, L + Dr]`:
the latent c_kv, then the rotated rope key. The model calls `forward(layer_id, q, latent,
None, fb)` with absorbed queries q `[T, H, L + Dr]` and the new tokens' rows `[T, 1, L + Dr]`
and gets `[T, H, L]` (before W_UV). Keys are whole rows, values their first L columns.
`TorchMLAAttention` runs the kernels' torch references (CPU, or a GPU reference);
`TritonMLAAttention` the Triton kernels, with the page-table handling (and so the CUDA
graphs) of `TritonAttention`. A quantized (fp8/int8) latent pool keeps one float32 scale
per row (`pool.k_scale`, `[num_slots, 1]`): new rows are quantized as they are stored
(`store_rows`, a few shape-static torch ops), the kernels fold the scale in on load, and
an extend reads its own new rows unquantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.attention.mla_decode import mla_decode, mla_decode_num_splits, mla_decode_ref
from kernels.attention.mla_extend import mla_extend, mla_extend_ref
from kernels.kv.store import store_rows
from runtime.worker.attention import AttentionBackend
from runtime.worker.attention_torch import TorchAttention
from runtime.worker.attention_triton import TritonAttention
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool, LayerKV


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


def store_latent(layer: LayerKV, latent: torch.Tensor, slots: torch.Tensor) -> None:
    """Write the new rows `[T, 1, L + Dr]` at `slots` of a latent pool's `layer` (quantized,
    with their scales, in a quantized pool)."""
    store_rows(latent, layer.k, slots, layer.k_scale)  # [T, 1, L + Dr], scales [T, 1]


class LatentAttention(AttentionBackend):
    """The latent pool's side of an MLA backend: its rows stored whole, the MLA kernels
    called on them (keys the whole rows, values their first L columns, one scale a row).
    Mixed in before a backend, whose page table and launch options it uses."""

    def __init__(self, pool: KVPool, mla: MlaShape) -> None:
        check_latent_pool(pool, mla)
        super().__init__(pool)
        self.mla = mla
        self.sm_scale = mla.sm_scale

    def store(self, layer: LayerKV, k: torch.Tensor, v: None, fb: ForwardBatch) -> None:
        store_latent(layer, k, fb.out_slots)

    def decode(self, layer: LayerKV, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        indptr, indices, seq_lens = self.page_table(fb)
        return self.decode_kernel(
            q, layer.k, indptr, indices, seq_lens, fb.page_size, self.sm_scale,
            kv_lora_rank=self.mla.kv_lora_rank, kv_scale=layer.k_scale,
            **self.decode_options(fb),
        )  # [B, H, L]  # fmt: skip

    def extend(
        self, layer: LayerKV, q: torch.Tensor, k: torch.Tensor, v: None, fb: ForwardBatch
    ) -> torch.Tensor:
        indptr, indices, _ = self.page_table(fb)
        return self.extend_kernel(
            q, k, layer.k, fb.qo_indptr, fb.prefix_lens, indptr, indices, fb.page_size,
            self.sm_scale, kv_lora_rank=self.mla.kv_lora_rank, kv_scale=layer.k_scale,
            **self.extend_options(fb),
        )  # [T, H, L]  # fmt: skip


class TorchMLAAttention(LatentAttention, TorchAttention):
    """`mla_decode_ref` / `mla_extend_ref` on the latent pool, in plain torch."""

    decode_kernel = staticmethod(mla_decode_ref)
    extend_kernel = staticmethod(mla_extend_ref)


class TritonMLAAttention(LatentAttention, TritonAttention):
    """`mla_decode` (split-KV, head groups) and `mla_extend` on the latent pool; decode
    graphs read the static page table of `TritonAttention`."""

    fuses_rope = False  # the model rotates the rope part of q and of the latent itself
    decode_kernel = staticmethod(mla_decode)
    extend_kernel = staticmethod(mla_extend)

    def _splits(self, batch: int, max_seq_len: int) -> int:
        return mla_decode_num_splits(batch, self.mla.num_heads, max_seq_len)

    def extend_options(self, fb: ForwardBatch) -> dict[str, Any]:
        return {"max_new_len": fb.attn_meta.max_new_len}
