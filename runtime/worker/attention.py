"""`AttentionBackend`: what the model and the graph runner ask of an attention implementation.

A ForwardBatch carries the backend-neutral inputs of a step: positions, the slots the new
tokens' K/V go to, lengths and the CSR page table (`kernels/kv/paging.py`). A backend derives
what its kernels need beyond that (split counts, padded widths, ...) once per step in
`prepare`, into `fb.attn_meta`, and the model calls `forward` once per layer. A backend
that runs in CUDA graphs also owns the static buffers a captured decode reads:
`init_graph` allocates them, `prepare_capture` points a capture batch at them and
`prepare_replay` fills them from a real batch. A backend with `fuses_rope` also takes q
and k before their rotation (`forward_rotary`) and rotates them in its store. `torch` and
`triton` are the two backends (`attention_torch.py`, `attention_triton.py`);
`model_runner.make_attention` picks one.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool, LayerKV


@dataclass(frozen=True)
class Rotary:
    """What a layer does to q and k before attention: RoPE from `cos_sin_cache` `[max_pos, D]`
    (`kernels.rope.rope_cos_sin_cache`), after a per-head RMSNorm of q and k when the model
    has one (Qwen3: `q_norm`/`k_norm` weights `[D]`, `eps`)."""

    cos_sin_cache: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    eps: float = 1e-6


class AttentionBackend(ABC):
    """Stores each layer's new K/V in the KV pool, then attends over the page table: a
    backend supplies `store`, the kernels and their launch options."""

    supports_graphs = False  # True: implements init_graph, prepare_capture, prepare_replay
    fuses_rope = False  # True: implements forward_rotary
    # the kernels `decode` and `extend` launch (staticmethods), with the arguments of
    # `kernels.attention.decode.decode_attention` and `extend.extend_attention`
    decode_kernel: Callable[..., torch.Tensor]
    extend_kernel: Callable[..., torch.Tensor]

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.sm_scale = 1.0 / math.sqrt(pool.head_dim)

    @abstractmethod
    def prepare(self, fb: ForwardBatch) -> None:
        """Set `fb.attn_meta` for an eager forward of `fb`, from its host lists and device
        tensors, without waiting for the device."""

    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """Store `k`, `v` ([T, Hkv, D]) at `fb.out_slots` in layer `layer_id`'s pool, then
        return causal attention of `q` ([T, Hq, D]) over each sequence's KV: [T, Hq, D]."""
        layer = self.pool.layer(layer_id)
        self.store(layer, k, v, fb)
        return self.attend(layer, q, k, v, fb)

    def attend(
        self, layer: LayerKV, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
        fb: ForwardBatch,
    ) -> torch.Tensor:
        """Attention of q over the pool, the new tokens' K/V already stored in `layer`: a
        decode reads only the pool, an extend also the new tokens' `k`, `v` as given."""
        if fb.is_decode:
            return self.decode(layer, q, fb)  # [B, Hq, D]
        return self.extend(layer, q, k, v, fb)  # [T, Hq, D]

    @abstractmethod
    def store(self, layer: LayerKV, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
        """Write the new tokens' K/V `[T, Hkv, D]` into `layer` at `fb.out_slots`."""

    def page_table(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr [B+1], kv_indices [>= P], seq_lens [B]): the page table the kernels
        read for `fb`."""
        return fb.kv_indptr, fb.kv_indices, fb.seq_lens

    def decode_options(self, fb: ForwardBatch) -> dict[str, Any]:
        """The decode kernel's launch options for `fb` (sizes `prepare` derived)."""
        return {}

    def extend_options(self, fb: ForwardBatch) -> dict[str, Any]:
        """The extend kernel's launch options for `fb` (sizes `prepare` derived)."""
        return {}

    def decode(self, layer: LayerKV, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """One query token a sequence `[B, Hq, D]` over its KV in the pool."""
        indptr, indices, seq_lens = self.page_table(fb)
        return self.decode_kernel(
            q, layer.k, layer.v, indptr, indices, seq_lens, fb.page_size, self.sm_scale,
            k_scale=layer.k_scale, v_scale=layer.v_scale, **self.decode_options(fb),
        )  # [B, Hq, D]  # fmt: skip

    def extend(
        self, layer: LayerKV, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        fb: ForwardBatch,
    ) -> torch.Tensor:
        """New tokens `[T, Hq, D]` over their cached prefix in the pool and themselves."""
        indptr, indices, _ = self.page_table(fb)
        return self.extend_kernel(
            q, k, v, layer.k, layer.v, fb.qo_indptr, fb.prefix_lens, indptr, indices,
            fb.page_size, self.sm_scale, k_scale=layer.k_scale, v_scale=layer.v_scale,
            **self.extend_options(fb),
        )  # [T, Hq, D]  # fmt: skip

    def forward_rotary(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        fb: ForwardBatch, rotary: Rotary,
    ) -> torch.Tensor:
        """`forward` of q and k before `rotary` (applied here at `fb.positions`, fused with
        the store): the same result as rotating them first and calling `forward`."""
        raise NotImplementedError(f"{type(self).__name__} does not fuse RoPE")

    def init_graph(self, max_bs: int, max_context: int, page_size: int) -> None:
        """Allocate the static buffers of decode graphs of up to `max_bs` sequences of up to
        `max_context` tokens, `page_size` slots a page."""
        raise NotImplementedError(f"{type(self).__name__} does not run in CUDA graphs")

    def prepare_capture(self, fb: ForwardBatch) -> None:
        """Set the metadata of the decode batch `fb` about to be captured (`fb.batch_size`
        padding rows) to views of the static buffers."""
        raise NotImplementedError(f"{type(self).__name__} does not run in CUDA graphs")

    def prepare_replay(self, fb: ForwardBatch, padded: int) -> None:
        """Copy the decode batch `fb`'s page table and lengths into the static buffers of
        the graph of `padded` >= `fb.batch_size` rows; the rows past `fb` read nothing."""
        raise NotImplementedError(f"{type(self).__name__} does not run in CUDA graphs")
