"""`TorchAttention`: the reference attention backend, the kernels' torch references on the pool."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.attention.decode import decode_attention_ref
from kernels.attention.extend_ref import extend_attention_ref
from kernels.kv.store import store_kv_ref
from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch


@dataclass(frozen=True)
class TorchAttentionMeta:
    """What the torch references need of a step beyond the ForwardBatch."""

    max_seq_len: int  # the longest sequence: the padded width of a decode batch


class TorchAttention(AttentionBackend):
    """The kernels' torch references (`store_kv_ref`, `decode_attention_ref`,
    `extend_attention_ref`) on the pool, in plain torch on the CPU or a GPU.

    Decode batches run as one padded SDPA call; extend batches loop over sequences, each
    reading its cached prefix from the pool and its new tokens' K/V as computed (as the
    Triton extend kernel does). K/V read from a quantized pool are dequantized. Extend
    reads the lengths on the host (a sync on a GPU) and nothing runs in CUDA graphs: on a
    GPU this backend is a reference, not a fast path.
    """

    def __init__(self, pool) -> None:
        super().__init__(pool)
        self.sm_scale = 1.0 / math.sqrt(pool.head_dim)

    def prepare(self, fb: ForwardBatch) -> None:
        fb.attn_meta = TorchAttentionMeta(max_seq_len=max(fb.seq_lens_cpu, default=0))

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        meta: TorchAttentionMeta = fb.attn_meta
        k_buf, v_buf = self.pool.k[layer_id], self.pool.v[layer_id]  # [slots, Hkv, D]
        k_scale, v_scale = self.pool.scales(layer_id)  # [slots, Hkv] f32, or None x2
        store_kv_ref(k, v, k_buf, v_buf, fb.out_slots, k_scale=k_scale, v_scale=v_scale)
        if fb.is_decode:
            return decode_attention_ref(
                q, k_buf, v_buf, fb.kv_indptr, fb.kv_indices, fb.seq_lens, fb.page_size,
                self.sm_scale, k_scale=k_scale, v_scale=v_scale, max_seq_len=meta.max_seq_len,
            )  # [B, Hq, D]  # fmt: skip
        return extend_attention_ref(
            q, k, v, k_buf, v_buf, fb.qo_indptr, fb.prefix_lens, fb.kv_indptr, fb.kv_indices,
            fb.page_size, self.sm_scale, k_scale=k_scale, v_scale=v_scale,
        )  # [T, Hq, D]  # fmt: skip
