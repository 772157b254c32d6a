"""Rooflines of the offline workload: decode is bandwidth-bound, prefill compute-bound.

A decode step reads every weight once plus the K and V of every position it attends:
floor(step) = (weight bytes + KV bytes) / 4.26 TB/s, the H200's measured copy bandwidth
(bytes read + written, device.md). The untied embedding table is the exception among the
weights: a step gathers only the batch's rows of it, so only those count. A prefill's floor
is its FLOPs at the measured dense matmul rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.model_config import resolve_model
from runtime.worker.models.llama import LlamaArch, LlamaForCausalLM

BANDWIDTH = 4.26e12  # bytes/s
COMPUTE = 780e12  # FLOP/s, dense bf16 matmul (device.md); taken for fp16 too


@dataclass(frozen=True)
class ModelBytes:
    """What one model moves and computes, in one dtype."""

    params: int  # bytes of every parameter (and of the fp8 weights' scales)
    embed: int  # bytes of the embedding table when it is not also the LM head (else 0)
    row: int  # bytes of one embedding row
    kv_per_token: int  # 2 (K and V) x layers x kv_heads x head_dim x element size
    body_params: int  # parameters every token multiplies: all but embedding and LM head
    head_params: int  # LM head parameters (applied to sampled tokens only)
    attn_flops_per_pair: int  # attention FLOPs per (query, key) pair, all layers

    @classmethod
    def of(cls, model: str, dtype: torch.dtype, quantization: str = "none") -> ModelBytes:
        """Sizes of `model` in `dtype`, from a copy built on the meta device (no memory).
        With fp8 `quantization` the projections count 1 byte per weight plus their float32
        scales; the prefill floor still counts the 16-bit matmul rate."""
        a = LlamaArch.from_hf(resolve_model(model).hf_config())
        with torch.device("meta"):
            meta = LlamaForCausalLM(a, quantization=quantization)
        params = sum(t.numel() for t in meta.parameters())
        size, table = dtype.itemsize, a.vocab_size * a.hidden_size
        stored = sum(t.numel() * (1 if t.dtype == torch.float8_e4m3fn else size)
                     for t in meta.parameters()) + sum(t.numel() * 4 for t in meta.buffers())
        tables = 1 if a.tie_word_embeddings else 2
        return cls(
            params=stored, embed=0 if a.tie_word_embeddings else table * size,
            row=a.hidden_size * size,
            kv_per_token=2 * a.num_layers * a.num_kv_heads * a.head_dim * size,
            body_params=params - tables * table, head_params=table,
            attn_flops_per_pair=4 * a.num_layers * a.num_heads * a.head_dim)  # q.k and p.v

    def step(self, batch: int, ctx: int) -> tuple[int, int]:
        """(weight bytes, KV bytes) read by a decode step of `batch` sequences x `ctx` positions."""
        weights = self.params - self.embed + (batch * self.row if self.embed else 0)
        return weights, batch * ctx * self.kv_per_token

    def floor_ms(self, batch: int, ctx: int) -> float:
        return sum(self.step(batch, ctx)) / BANDWIDTH * 1e3

    def decode_tok_s(self, batch: int, input_len: int, output_len: int) -> float:
        """Output tok/s of a batch decoding `output_len` tokens after `input_len`-token prompts
        with every step at its floor (step i attends input_len + i positions); prefill free."""
        ms = sum(self.floor_ms(batch, input_len + i) for i in range(1, output_len + 1))
        return batch * output_len / ms * 1e3

    def prefill_floor_ms(self, batch: int, input_len: int) -> float:
        """Compute floor of prefilling `batch` prompts: 2 FLOPs per body parameter per token,
        causal attention, and the LM head on each prompt's last token."""
        tokens = batch * input_len
        flops = (2 * self.body_params * tokens + 2 * self.head_params * batch
                 + self.attn_flops_per_pair * batch * input_len * (input_len + 1) // 2)
        return flops / COMPUTE * 1e3

    def offline_tok_s(self, batch: int, input_len: int, output_len: int) -> float:
        """Output tok/s with the prefill at its compute floor (it yields the first token) and
        every later decode step at its bandwidth floor."""
        ms = self.prefill_floor_ms(batch, input_len) + sum(
            self.floor_ms(batch, input_len + i) for i in range(1, output_len))
        return batch * output_len / ms * 1e3
