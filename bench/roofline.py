"""Rooflines of the offline workload: decode is bandwidth-bound, prefill compute-bound.

A decode step reads every weight once plus the K and V of every position it attends:
floor(step) = (weight bytes + KV bytes) / 4.26 TB/s, the H200's measured copy bandwidth
(bytes read + written, device.md). The untied embedding table is the exception among the
weights: a step gathers only the batch's rows of it, so only those count. A prefill's floor
is its FLOPs at the measured dense matmul rate.

For a mixture-of-experts model (DeepSeek, Qwen3-MoE, Mixtral) a step reads only the routed
experts its tokens pick: with k of E experts a token, uniform routing touches
1 - (1 - k/E)^batch of them per layer on average, and that share of the experts' bytes
counts; a prefill token multiplies k/E of the experts' parameters. DeepSeek's KV is one
latent row a token and layer (MLA), and its attention FLOPs those of the absorbed form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.model_config import resolve_model
from runtime.worker.loader import build_model
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.models.sparse_moe import SparseMoeBlock

BANDWIDTH = 4.26e12  # bytes/s
COMPUTE = 780e12  # FLOP/s, dense bf16 matmul (device.md); taken for fp16 too


@dataclass(frozen=True)
class ModelBytes:
    """What one model moves and computes, in one dtype."""

    params: int  # bytes of every parameter (and of the fp8 weights' scales)
    embed: int  # bytes of the embedding table when it is not also the LM head (else 0)
    row: int  # bytes of one embedding row
    kv_per_token: int  # 2 (K, V) x layers x kv_heads x head_dim x size; MLA: layers x latent
    body_params: int  # parameters every token multiplies: all but embedding and LM head
    head_params: int  # LM head parameters (applied to sampled tokens only)
    attn_flops_per_pair: int  # attention FLOPs per (query, key) pair, all layers
    expert_bytes: int = 0  # bytes of every routed expert (MoE), part of `params`
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0  # experts a token picks

    @classmethod
    def of(cls, model: str, dtype: torch.dtype, quantization: str = "none") -> ModelBytes:
        """Sizes of `model` in `dtype`, from a copy built on the meta device (no memory).
        With fp8 `quantization` the projections count 1 byte per weight plus their float32
        scales; the prefill floor still counts the 16-bit matmul rate."""
        with torch.device("meta"):
            meta = build_model(resolve_model(model).hf_config(), None, quantization)
        a = meta.arch
        params = sum(t.numel() for t in meta.parameters())
        size, table = dtype.itemsize, a.vocab_size * a.hidden_size
        stored = sum(t.numel() * (1 if t.dtype == torch.float8_e4m3fn else size)
                     for t in meta.parameters()) + sum(t.numel() * 4 for t in meta.buffers())
        tables = 1 if a.tie_word_embeddings else 2
        blocks = [m for m in meta.modules() if isinstance(m, SparseMoeBlock)]
        moe, idle = {}, 0  # idle: expert parameters a token does not multiply
        if blocks:
            experts, top_k = blocks[0].experts.shape[0], blocks[0].routing.top_k
            numel = sum(t.numel() for b in blocks for t in b.experts.parameters())
            moe = dict(expert_bytes=size * numel, experts=experts, top_k=top_k)
            idle = numel * (experts - top_k) // experts
        if isinstance(meta, DeepseekForCausalLM):
            kv = a.num_layers * a.latent_dim * size
            # absorbed: q.k over L + Dr dims, p.v over L, per head
            attn = 2 * a.num_layers * a.num_heads * (a.latent_dim + a.kv_lora_rank)
        else:
            kv = 2 * a.num_layers * a.num_kv_heads * a.head_dim * size
            attn = 4 * a.num_layers * a.num_heads * a.head_dim  # q.k and p.v
        return cls(
            params=stored, embed=0 if a.tie_word_embeddings else table * size,
            row=a.hidden_size * size, kv_per_token=kv,
            body_params=params - tables * table - idle, head_params=table,
            attn_flops_per_pair=attn, **moe)

    def step(self, batch: int, ctx: int) -> tuple[int, int]:
        """(weight bytes, KV bytes) read by a decode step of `batch` sequences x `ctx` positions."""
        weights = self.params - self.embed + (batch * self.row if self.embed else 0)
        if self.experts:  # the expected share of routed experts the batch touches
            touched = 1 - (1 - self.top_k / self.experts) ** batch
            weights -= round(self.expert_bytes * (1 - touched))
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
