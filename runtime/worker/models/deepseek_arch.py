"""The shape of a DeepSeek-V2/V3 model (multi-head latent attention + mixture of experts),
read from a transformers config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SUPPORTED_TYPES = ("deepseek_v2", "deepseek_v3")
ROPE_TYPES = ("default", "yarn")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `factor` times."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class DeepseekArch:
    """Attention: each token's KV is a latent of `kv_lora_rank` values (normed) plus one
    rotated rope key of `qk_rope_head_dim` shared by all heads; per head, queries and keys
    have `qk_nope_head_dim + qk_rope_head_dim` dims and values `v_head_dim`. Queries come
    straight from the hidden state (`q_lora_rank` None, V2-Lite) or through a rank
    `q_lora_rank` bottleneck. FFN: the first `first_k_dense_replace` layers (and those off
    `moe_layer_freq`) are dense of width `intermediate_size`; the others route each token to
    `num_experts_per_tok` of `n_routed_experts` experts of width `moe_intermediate_size`,
    plus `n_shared_experts` always-on experts (fused into one MLP of n times that width)."""

    kind: str  # "deepseek_v2" | "deepseek_v3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_interleave: bool  # checkpoint rope dims in (x0, x1), (x2, x3)... pairs
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    moe_layer_freq: int
    n_group: int
    topk_group: int
    scoring_func: str  # "softmax" (V2) | "sigmoid" (V3)
    correction_bias: bool  # V3 "noaux_tc": e_score_correction_bias steers the picks
    norm_topk_prob: bool
    routed_scaling_factor: float
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta, YaRN parameters
    max_position: int = 4096
    sliding_window: None = None  # MLA models attend to the whole context

    @classmethod
    def from_hf(cls, config) -> DeepseekArch:
        kind = config.model_type
        if kind not in SUPPORTED_TYPES:
            raise NotImplementedError(f"model_type {kind!r}; supported: {SUPPORTED_TYPES}")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {config.hidden_act!r}; only silu")
        if getattr(config, "attention_bias", False):
            raise NotImplementedError("attention_bias: DeepSeek checkpoints have none")
        rope = dict(
            getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        )
        rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
        rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
        if rope["rope_type"] not in ROPE_TYPES:
            raise NotImplementedError(f"rope {rope}; supported types: {ROPE_TYPES}")
        v3 = kind == "deepseek_v3"
        # V2: softmax scores, "greedy" or "group_limited_greedy"; V3: sigmoid, "noaux_tc"
        grouped = v3 or getattr(config, "topk_method", "greedy") != "greedy"
        return cls(
            kind=kind,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            q_lora_rank=config.q_lora_rank,
            kv_lora_rank=config.kv_lora_rank,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            rope_interleave=bool(getattr(config, "rope_interleave", True)) if v3 else True,
            n_routed_experts=config.n_routed_experts,
            n_shared_experts=config.n_shared_experts or 0,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=config.moe_intermediate_size,
            first_k_dense_replace=config.first_k_dense_replace,
            moe_layer_freq=getattr(config, "moe_layer_freq", None) or 1,
            n_group=(config.n_group or 1) if grouped else 1,
            topk_group=(config.topk_group or 1) if grouped else 1,
            scoring_func="sigmoid" if v3 else "softmax",
            correction_bias=v3,
            norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
            routed_scaling_factor=float(config.routed_scaling_factor),
            rope=rope,
            max_position=getattr(config, "max_position_embeddings", 4096),
        )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values a token stores per layer: the latent, then the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def sm_scale(self) -> float:
        """The softmax scale: 1/sqrt(qk_head_dim), times YaRN's mscale(all_dim)^2."""
        scale = self.qk_head_dim**-0.5
        all_dim = self.rope.get("mscale_all_dim", 0) if self.rope["rope_type"] == "yarn" else 0
        if all_dim:
            scale *= yarn_mscale(self.rope["factor"], all_dim) ** 2
        return scale

    def is_moe_layer(self, layer_id: int) -> bool:
        return (
            self.n_routed_experts > 0
            and layer_id >= self.first_k_dense_replace
            and layer_id % self.moe_layer_freq == 0
        )
