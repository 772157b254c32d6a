"""Per-forward state: the tensors one model forward reads, built by the worker from a BatchPlan."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.worker.lora.batch import LoraBatch


@dataclass
class ForwardBatch:
    """One step over B sequences with T new tokens in total (T == B for pure decode).

    Sequence i computes KV positions [prefix_lens[i], seq_lens[i]); its new tokens are
    input_ids[qo_indptr[i]:qo_indptr[i+1]]. The KV of every position of sequence i
    (cached prefix and new tokens) lives in the pages kv_indices[kv_indptr[i]:kv_indptr[i+1]]:
    position p at slot kv_indices[kv_indptr[i] + p // page_size] * page_size + p % page_size
    (`kernels/kv/paging.py`; page_size 1 lists every slot). The new tokens' K/V must be stored
    at `out_slots` before attention reads them. All of this is backend-neutral; what one
    attention backend derives from it for its kernels is `attn_meta` (`AttentionBackend.prepare`).
    """

    input_ids: torch.Tensor  # [T] int64, placeholders already resolved
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64, pool slot of each new token
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32, into kv_indices
    kv_indices: torch.Tensor  # [sum(ceil(seq_lens / page_size))] int64 page ids
    seq_lens: torch.Tensor  # [B] int32, prefix + new
    prefix_lens: torch.Tensor  # [B] int32
    # [S + L] int64: indices into T whose logits are returned, the S sampled tokens first,
    # then the L positions whose input logprobs were asked (BatchPlan.input_logprobs)
    sample_idx: torch.Tensor
    # every sequence has exactly one new token and every token's logits are returned
    # (sample_idx == arange(T)); a verify step's tokens may be sequences of their own, each
    # over its request's KV up to itself (`BatchBuilder`)
    is_decode: bool
    # host copies, so backends size launches and loops without reading the device
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    page_size: int = 1  # slots per page of kv_indices
    attn_meta: object = None  # the attention backend's metadata of this step, once prepared
    lora: LoraBatch | None = None  # the tokens' LoRA adapter slots; None: no adapter
    # [B] int64: the request row of each sequence (a model keeping state per request reads it)
    rows: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
