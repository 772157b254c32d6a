"""Test helper: tiny random transformers checkpoints of each supported family."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=512,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)
FAMILIES = {
    "llama": (LlamaConfig, dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True)),
    "llama3-rope": (LlamaConfig, dict(rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)),
    "linear-rope": (LlamaConfig, dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "qwen2-tied": (Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, dict(head_dim=32, num_key_value_heads=1)),
    "mistral": (MistralConfig, dict(sliding_window=None)),
    # sparse layers 0 and 2, a dense MLP on layer 1 (`mlp_only_layers`)
    "qwen3_moe": (Qwen3MoeConfig, dict(num_hidden_layers=3, head_dim=32, num_experts=8,
                                       num_experts_per_tok=3, moe_intermediate_size=32,
                                       norm_topk_prob=True, mlp_only_layers=[1])),
    # a dense layer 0 by `decoder_sparse_step`, top-k weights not renormalized
    "qwen3_moe-step2": (Qwen3MoeConfig, dict(num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=48, decoder_sparse_step=2)),
    "mixtral": (MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2,
                                    sliding_window=None)),
}


def tiny_checkpoint(family: str, folder, **overrides) -> torch.nn.Module:
    """Save a random tiny HF model of `family` (config fields `overrides` changed) to
    `folder`; return it (fp32, eval)."""
    config_cls, extra = FAMILIES[family]
    config = config_cls(**{**BASE, **extra, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # every tensor random (HF zero-inits biases, ones norms)
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape)
            param.copy_(1 + 0.1 * noise if "norm" in name else 0.05 * noise)
    model.save_pretrained(folder)
    return model
