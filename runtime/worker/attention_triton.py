"""`TritonAttention`: the GPU attention backend over the KV pool, at the batch's page size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.attention.decode import decode_attention, decode_num_splits
from kernels.attention.extend import extend_attention
from kernels.kv.rope_store import rope_store_kv
from kernels.kv.store import store_kv
from runtime.worker.attention import AttentionBackend, Rotary
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import LayerKV
from runtime.worker.quant.fp8_linear import MIN_CAPABILITY, QuantizationError


def check_pool_support(
    pool_dtype: torch.dtype, device: torch.device, capability: tuple[int, int] | None = None
) -> None:
    """Raise QuantizationError when the kernels cannot run a `pool_dtype` pool on `device`:
    Triton converts to and from float8_e4m3fn only on CUDA compute capability 8.9+.
    `capability` overrides the device's (for tests)."""
    if pool_dtype != torch.float8_e4m3fn or device.type != "cuda":
        return
    cap = capability or torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        raise QuantizationError(
            f"--kv-dtype fp8 needs fp8 conversions in the Triton attention kernels (CUDA "
            f"compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+); this GPU is "
            f"{cap[0]}.{cap[1]}; serve it with --kv-dtype int8 or auto")


@dataclass(frozen=True)
class TritonAttentionMeta:
    """The page table the kernels read (the batch's own, or a graph's static copy) and
    their launch sizes."""

    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [>= P] page ids
    seq_lens: torch.Tensor  # [B] int32
    num_splits: int  # decode: split-KV programs per sequence
    max_new_len: int  # extend: the longest run of new tokens (sizes the grid)
    max_prefix_len: int  # extend: the longest cached prefix (0: the pool is not read)


class TritonAttention(AttentionBackend):
    """Stores new K/V with `store_kv` (or rotates q and k and stores in one launch,
    `rope_store_kv`), then split-KV decode or varlen extend attention.

    Decode reads every position through the page table (`kv_indices`, `fb.page_size`
    slots a page); extend reads the cached prefix through it and the new tokens straight
    from k/v. A quantized pool (fp8/int8) passes its per-(slot, head) scales to all three
    kernels: `store_kv` quantizes, the attention kernels dequantize on load (the new
    tokens of an extend are read unquantized); an fp8_e4m3 pool passes none (scale 1).
    Decode graphs read a static copy of the page table, with the split count fixed for the
    longest context.
    """

    supports_graphs = True
    fuses_rope = True
    decode_kernel = staticmethod(decode_attention)
    extend_kernel = staticmethod(extend_attention)

    def __init__(self, pool) -> None:
        super().__init__(pool)
        check_pool_support(pool.dtype, pool.k[0].device)
        self.num_sms = (
            torch.cuda.get_device_properties(0).multi_processor_count
            if torch.cuda.is_available()
            else 132
        )

    def prepare(self, fb: ForwardBatch) -> None:
        decode = fb.is_decode
        fb.attn_meta = TritonAttentionMeta(
            fb.kv_indptr, fb.kv_indices, fb.seq_lens,
            num_splits=self._splits(fb.batch_size, max(fb.seq_lens_cpu)) if decode else 0,
            max_new_len=0 if decode else max(fb.extend_lens_cpu),
            max_prefix_len=0 if decode else max(fb.prefix_lens_cpu),
        )  # fmt: skip

    def _splits(self, batch: int, max_seq_len: int) -> int:
        return decode_num_splits(batch, self.pool.kv_heads, max_seq_len, self.num_sms,
                                 quantized=self.pool.quantized)

    def store(self, layer: LayerKV, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
        k, v = k.contiguous(), v.contiguous()  # views of the fused QKV output otherwise
        store_kv(k, v, layer.k, layer.v, fb.out_slots, k_scale=layer.k_scale,
                 v_scale=layer.v_scale)

    def forward_rotary(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        fb: ForwardBatch, rotary: Rotary,
    ) -> torch.Tensor:
        layer = self.pool.layer(layer_id)
        q, k, v = rope_store_kv(
            q, k, v, layer.k, layer.v, fb.out_slots, fb.positions, rotary.cos_sin_cache,
            k_scale=layer.k_scale, v_scale=layer.v_scale, q_norm=rotary.q_norm,
            k_norm=rotary.k_norm, eps=rotary.eps, kv_out=not fb.is_decode,
        )  # [T, Hq, D] rotated; an extend's new K/V [T, Hkv, D] x2, decode None x2  # fmt: skip
        return self.attend(layer, q, k, v, fb)

    def page_table(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        meta: TritonAttentionMeta = fb.attn_meta  # the batch's own, or a graph's static copy
        return meta.kv_indptr, meta.kv_indices, meta.seq_lens

    def decode_options(self, fb: ForwardBatch) -> dict[str, Any]:
        return {"num_splits": fb.attn_meta.num_splits}

    def extend_options(self, fb: ForwardBatch) -> dict[str, Any]:
        meta: TritonAttentionMeta = fb.attn_meta
        return {"max_new_len": meta.max_new_len, "max_prefix_len": meta.max_prefix_len}

    def init_graph(self, max_bs: int, max_context: int, page_size: int) -> None:
        device = self.pool.k[0].device
        self.max_context = max_context
        self.graph_seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)  # [N]
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)  # [N+1]
        # every row at full context, and one page id past them, where the padding rows' lists
        # start: a read of their position 0 stays in the buffer
        pages = max_bs * -(-max_context // page_size) + 1
        self.graph_kv_indices = torch.zeros(pages, dtype=torch.int64, device=device)  # [pages]

    def prepare_capture(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        fb.attn_meta = TritonAttentionMeta(
            self.graph_kv_indptr[: bs + 1], self.graph_kv_indices, self.graph_seq_lens[:bs],
            num_splits=self._splits(bs, self.max_context), max_new_len=0, max_prefix_len=0,
        )  # fmt: skip

    def prepare_replay(self, fb: ForwardBatch, padded: int) -> None:
        bs, nnz = fb.batch_size, fb.kv_indices.shape[0]
        self.graph_seq_lens[:bs].copy_(fb.seq_lens, non_blocking=True)
        self.graph_kv_indptr[: bs + 1].copy_(fb.kv_indptr, non_blocking=True)
        self.graph_kv_indices[:nnz].copy_(fb.kv_indices, non_blocking=True)
        if padded > bs:  # padding rows: empty sequences
            self.graph_seq_lens[bs:padded].zero_()
            self.graph_kv_indptr[bs + 1 : padded + 1].fill_(nnz)
