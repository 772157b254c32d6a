"""The shape of a DeepSeek-V4 model, read from a transformers `DeepseekV4Config`, and the
config fields the runtime refuses (`UnsupportedArchitecture`, naming the field).

Every layer attends over a sliding window of its own recent tokens (one shared K=V head
of `head_dim`, a partial interleaved RoPE on its last `rope_dim` values, a learned sink per
query head). "compressed_sparse_attention" (CSA) layers add one compressed entry per
`compress_rate` tokens, of which a Lightning Indexer picks `index_topk` per query;
"heavily_compressed_attention" (HCA) layers add one entry per (larger) `compress_rate`
tokens, all attended. The residual is `hc_mult` streams mixed by hyper-connections; the FFN
is a mixture of experts, hash-routed (a fixed token -> experts table) on "hash_moe" layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.model_errors import UnsupportedArchitecture

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SWA, CSA, HCA)
MLP_TYPES = ("hash_moe", "moe")
SCORING_FUNCS = ("sqrtsoftplus", "sigmoid")
ROPE_TYPES = ("default", "yarn")


@dataclass(frozen=True)
class DeepseekV4Arch:
    """What the model code needs of a V4 config (transformers' field names where kept)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_dim: int  # the trailing dims of each head that rotate
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window: int  # tokens of the sliding window, the query's own included
    layer_types: tuple[str, ...]
    compress_rates: tuple[tuple[str, int], ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    mlp_layer_types: tuple[str, ...]
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    scoring_func: str
    routed_scaling_factor: float
    swiglu_limit: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_main: dict  # rope_type, rope_theta (+ YaRN fields): sliding-window layers
    rope_compress: dict  # CSA / HCA layers, their compressors and the indexer
    max_position: int

    @property
    def num_kv_heads(self) -> int:
        return 1

    @property
    def sliding_window(self) -> None:
        """None: the window is part of the architecture, exact at any length, so it does not
        cap the context as a windowed approximation of full attention would."""
        return None

    def rate(self, layer_id: int) -> int:
        """Tokens per compressed entry of layer `layer_id` (0: sliding window only)."""
        kind = self.layer_types[layer_id]
        return 0 if kind == SWA else dict(self.compress_rates)[kind]

    @classmethod
    def from_hf(cls, config) -> DeepseekV4Arch:
        """The shape of `config`; `UnsupportedArchitecture` for a layer type, compression
        rate, scoring function, activation, RoPE type or KV head count not implemented."""
        n = config.num_hidden_layers
        layer_types = tuple(config.layer_types)
        mlp_types = tuple(config.mlp_layer_types)
        for name, types, allowed in (("layer_types", layer_types, LAYER_TYPES),
                                     ("mlp_layer_types", mlp_types, MLP_TYPES)):
            bad = sorted({t for t in types if t not in allowed})
            if bad or len(types) != n:
                raise UnsupportedArchitecture(
                    name, f"{n} entries of {allowed} are supported, got {list(types)}")
        rates = dict(config.compress_rates)
        for kind in (CSA, HCA):
            rate = rates.get(kind)
            if kind in layer_types and (not isinstance(rate, int) or rate < 1):
                raise UnsupportedArchitecture(
                    "compress_rates", f"{kind} needs a positive whole rate, got {rate!r}")
        if config.scoring_func not in SCORING_FUNCS:
            raise UnsupportedArchitecture(
                "scoring_func", f"{config.scoring_func!r}; supported: {SCORING_FUNCS}")
        if config.hidden_act != "silu":
            raise UnsupportedArchitecture("hidden_act", f"{config.hidden_act!r}; only silu")
        if config.num_key_value_heads != 1:
            raise UnsupportedArchitecture(
                "num_key_value_heads", f"{config.num_key_value_heads}; V4 shares one K=V head")
        ropes = config.rope_parameters
        for label in ("main", "compress"):
            kind = ropes[label].get("rope_type", "default")
            if kind not in ROPE_TYPES:
                raise UnsupportedArchitecture(
                    "rope_scaling", f"{label} rope {kind!r}; supported: {ROPE_TYPES}")
        return cls(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=n,
            num_heads=config.num_attention_heads, head_dim=config.head_dim,
            rope_dim=config.qk_rope_head_dim, q_lora_rank=config.q_lora_rank,
            o_groups=config.o_groups, o_lora_rank=config.o_lora_rank,
            window=config.sliding_window, layer_types=layer_types,
            compress_rates=tuple((k, rates[k]) for k in (CSA, HCA) if k in rates),
            index_n_heads=config.index_n_heads, index_head_dim=config.index_head_dim,
            index_topk=config.index_topk, hc_mult=config.hc_mult,
            hc_sinkhorn_iters=config.hc_sinkhorn_iters, hc_eps=config.hc_eps,
            mlp_layer_types=mlp_types, n_routed_experts=config.n_routed_experts,
            n_shared_experts=config.n_shared_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=config.moe_intermediate_size,
            scoring_func=config.scoring_func,
            routed_scaling_factor=config.routed_scaling_factor,
            swiglu_limit=config.swiglu_limit, rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=config.tie_word_embeddings,
            rope_main=dict(ropes["main"]), rope_compress=dict(ropes["compress"]),
            max_position=config.max_position_embeddings,
        )
