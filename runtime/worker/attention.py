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

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool


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
    """Stores each layer's new K/V in the KV pool, then attends over the page table."""

    supports_graphs = False  # True: implements init_graph, prepare_capture, prepare_replay
    fuses_rope = False  # True: implements forward_rotary

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    @abstractmethod
    def prepare(self, fb: ForwardBatch) -> None:
        """Set `fb.attn_meta` for an eager forward of `fb`, from its host lists and device
        tensors, without waiting for the device."""

    @abstractmethod
    def forward(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """Store `k`, `v` ([T, Hkv, D]) at `fb.out_slots` in layer `layer_id`'s pool, then
        return causal attention of `q` ([T, Hq, D]) over each sequence's KV: [T, Hq, D]."""

    def forward_rotary(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        fb: ForwardBatch,
        rotary: Rotary,
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
