"""`TorchAttention`: the reference attention backend, the kernels' torch references on the pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.attention.decode import decode_attention_ref
from kernels.attention.extend_ref import extend_attention_ref
from kernels.kv.store import store_kv_ref
from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import LayerKV


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

    decode_kernel = staticmethod(decode_attention_ref)
    extend_kernel = staticmethod(extend_attention_ref)

    def prepare(self, fb: ForwardBatch) -> None:
        fb.attn_meta = TorchAttentionMeta(max_seq_len=max(fb.seq_lens_cpu, default=0))

    def store(self, layer: LayerKV, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
        store_kv_ref(k, v, layer.k, layer.v, fb.out_slots, k_scale=layer.k_scale,
                     v_scale=layer.v_scale)

    def decode_options(self, fb: ForwardBatch) -> dict[str, Any]:
        meta: TorchAttentionMeta = fb.attn_meta
        return {"max_seq_len": meta.max_seq_len}
