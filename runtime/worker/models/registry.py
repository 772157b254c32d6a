"""The model families by the transformers `model_type` of a checkpoint's config."""

from __future__ import annotations

from runtime.worker.models.causal_lm import CausalLM
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.models.deepseek_v4 import DeepseekV4ForCausalLM
from runtime.worker.models.llama import LlamaForCausalLM
from runtime.worker.models.llama_moe import MixtralForCausalLM, Qwen3MoeForCausalLM

FAMILIES: tuple[type[CausalLM], ...] = (
    LlamaForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekForCausalLM,
    DeepseekV4ForCausalLM,
)
SUPPORTED_TYPES = tuple(kind for family in FAMILIES for kind in family.MODEL_TYPES)


def model_class(config) -> type[CausalLM]:
    """The class that runs a transformers config's `model_type` (llama when it has none)."""
    kind = getattr(config, "model_type", "llama")
    for family in FAMILIES:
        if kind in family.MODEL_TYPES:
            return family
    raise NotImplementedError(f"model_type {kind!r}; supported: {SUPPORTED_TYPES}")
