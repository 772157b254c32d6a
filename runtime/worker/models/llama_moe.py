"""Mixture-of-experts Llama-family decoders: Qwen3-MoE and Mixtral.

Attention is the Llama family's (with Qwen3's per-head q/k RMSNorm for `qwen3_moe`, and
Mistral's treatment of `sliding_window` for `mixtral`). The feed-forward block of a sparse
layer is a `SparseMoeBlock`: softmax over all experts' router logits, the top
`num_experts_per_tok`, renormalized to sum to 1 (always for Mixtral; with `norm_topk_prob`
for Qwen3-MoE), no shared experts. Qwen3-MoE layers off `decoder_sparse_step` or listed in
`mlp_only_layers` keep a dense MLP of `intermediate_size`; Mixtral's experts have
`intermediate_size` and every layer is sparse.

Checkpoints store each expert's projections apart (`mlp.experts.{e}.gate_proj` / `up_proj` /
`down_proj`; Mixtral's `block_sparse_moe.experts.{e}.w1` / `w3` / `w2`); they load as row
ranges of the stacked `w13` / `w2`. Under tensor parallelism each rank holds every expert at
1/N of its width (gate and up cut by rows, down by columns); the router is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.worker.models.causal_lm import Piece
from runtime.worker.models.llama import LlamaArch, LlamaForCausalLM
from runtime.worker.models.sparse_moe import EXPERT_NAMES, Routing, SparseMoeBlock, expert_pieces


@dataclass(frozen=True, kw_only=True)
class LlamaMoeArch(LlamaArch):
    """A Llama-family shape whose sparse layers route each token to `num_experts_per_tok`
    of `num_experts` experts of width `moe_intermediate_size`."""

    MODEL_TYPES = ("qwen3_moe", "mixtral")

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    sparse_step: int = 1  # layer i is sparse when (i + 1) % sparse_step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and it is not listed here

    @classmethod
    def hf_fields(cls, config) -> dict:
        mixtral = config.model_type == "mixtral"
        return dict(
            super().hf_fields(config),
            num_experts=config.num_local_experts if mixtral else config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=(config.intermediate_size if mixtral
                                   else config.moe_intermediate_size),
            norm_topk_prob=mixtral or bool(getattr(config, "norm_topk_prob", False)),
            sparse_step=getattr(config, "decoder_sparse_step", None) or 1,
            mlp_only_layers=tuple(getattr(config, "mlp_only_layers", None) or ()),
        )

    def is_sparse(self, layer_id: int) -> bool:
        return (self.num_experts > 0 and (layer_id + 1) % self.sparse_step == 0
                and layer_id not in self.mlp_only_layers)


class LlamaMoeForCausalLM(LlamaForCausalLM):
    """A Llama-family decoder whose sparse layers hold a `SparseMoeBlock`. fp8 weights
    (`--quantization fp8` or an fp8 checkpoint) apply to attention and the dense MLPs; the
    router and the experts stay 16-bit (an fp8 checkpoint's dequantized at load).
    `EXPERT_NAMES` are the checkpoint's names of an expert's gate, up and down projections."""

    ARCH = LlamaMoeArch
    EXPERT_NAMES = EXPERT_NAMES

    def mlp(self, layer_id: int) -> nn.Module:
        a = self.arch
        if not a.is_sparse(layer_id):
            return super().mlp(layer_id)
        routing = Routing(a.num_experts_per_tok, renormalize=a.norm_topk_prob)
        return SparseMoeBlock(a.num_experts, a.hidden_size, a.moe_intermediate_size, routing,
                              self.tp)

    def checkpoint_pieces(self, module: str, leaf: str, param: torch.Tensor) -> list[Piece]:
        """The stacked experts take each expert's gate, up and down tensors."""
        if module == "experts":
            return expert_pieces(leaf, param, self.arch.num_experts, self.EXPERT_NAMES)
        return super().checkpoint_pieces(module, leaf, param)


class Qwen3MoeForCausalLM(LlamaMoeForCausalLM):
    """Qwen3MoeForCausalLM checkpoints (Qwen3-30B-A3B, Qwen3-235B-A22B)."""

    MODEL_TYPES = ("qwen3_moe",)


class MixtralForCausalLM(LlamaMoeForCausalLM):
    """MixtralForCausalLM checkpoints (Mixtral-8x7B, 8x22B): the sparse block is named
    `block_sparse_moe` and an expert's gate, up and down projections `w1`, `w3`, `w2`."""

    MODEL_TYPES = ("mixtral",)
    EXPERT_NAMES = ("w1", "w3", "w2")
    MODULE_RENAMES = (("mlp", "block_sparse_moe"),)
    COLUMN_PARALLEL = (*LlamaForCausalLM.COLUMN_PARALLEL, "w1", "w3")
    ROW_PARALLEL = (*LlamaForCausalLM.ROW_PARALLEL, "w2")
