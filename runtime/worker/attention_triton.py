"""`TritonAttention`: the GPU attention backend over the KV pool, at the batch's page size."""

from __future__ import annotations

import math

import torch

from kernels.decode_attention import decode_attention, decode_num_splits
from kernels.extend_attention import extend_attention
from kernels.store_kv import store_kv
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool


class TritonAttention:
    """Stores new K/V with `store_kv`, then split-KV decode or varlen extend attention.

    Decode reads every position through the page table (`kv_indices`, `fb.page_size`
    slots a page); extend reads the cached prefix through it and the new tokens straight
    from k/v. Same interface as
    `TorchAttention`, so the model does not know which one runs. A quantized pool
    (fp8/int8) passes its per-(slot, head) scales to all three kernels: `store_kv` quantizes,
    the attention kernels dequantize on load (the new tokens of an extend are read unquantized).
    """

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.sm_scale = 1.0 / math.sqrt(pool.head_dim)
        self.num_sms = torch.cuda.get_device_properties(0).multi_processor_count \
            if torch.cuda.is_available() else 132

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        k_buf, v_buf = self.pool.k[layer_id], self.pool.v[layer_id]  # [slots, Hkv, D]
        k_scale, v_scale = self.pool.scales(layer_id)  # [slots, Hkv] f32, or None x2
        k, v = k.contiguous(), v.contiguous()  # views of the fused QKV output otherwise
        store_kv(k, v, k_buf, v_buf, fb.out_slots, k_scale=k_scale, v_scale=v_scale)
        if fb.is_decode:
            splits = fb.decode_splits or decode_num_splits(
                fb.batch_size, self.pool.kv_heads, max(fb.seq_lens_cpu), self.num_sms)
            return decode_attention(q, k_buf, v_buf, fb.kv_indptr, fb.kv_indices, fb.seq_lens,
                                    fb.page_size, self.sm_scale, k_scale=k_scale, v_scale=v_scale,
                                    num_splits=splits)  # [B, Hq, D]
        return extend_attention(q, k, v, k_buf, v_buf, fb.qo_indptr, fb.prefix_lens,
                                fb.kv_indptr, fb.kv_indices, fb.page_size, self.sm_scale,
                                k_scale=k_scale, v_scale=v_scale,
                                max_new_len=max(fb.extend_lens_cpu))  # [T, Hq, D]
