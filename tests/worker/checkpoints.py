"""Test helper: tiny random transformers checkpoints of each supported family."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
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
