"""`dummy:<preset>` models: the config of a known architecture and size, with random
weights (`--model dummy:llama3-8b`), for benchmarks and tests without a checkpoint.

A preset lists what differs from a Llama config (`model_type` "llama", the LM head not
tied): its dimensions, then its family's settings.
"""

from __future__ import annotations

from typing import Any


def _shape(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
           vocab: int, context: int, **family: Any) -> dict[str, Any]:
    """A config: hidden size, MLP width, layers, query and KV heads, vocabulary, context
    length, and the family's other settings."""
    return dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                max_position_embeddings=context, **family)


def _llama3_rope(factor: float) -> dict[str, Any]:
    return dict(rope_type="llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192)


_LLAMA = dict(rms_norm_eps=1e-5, rope_theta=10000.0)
_LLAMA3 = dict(rms_norm_eps=1e-5, rope_theta=500000.0)
# MLA without a q LoRA, routed + shared experts, the first layer dense
_DEEPSEEK_V2 = dict(model_type="deepseek_v2", rms_norm_eps=1e-6, rope_theta=10000.0,
                    q_lora_rank=None, first_k_dense_replace=1, topk_method="greedy",
                    routed_scaling_factor=1.0)
# V4: one K=V head of 512 with 64 rope dims, a 128-token window, CSA (rate 4, top 512 of the
# indexer's picks) and HCA (rate 128) layers, 4 hyper-connection streams, sqrt(softplus)
# routing, the first 3 MoE layers hash-routed, YaRN on the compressed layers' RoPE
_CSA, _HCA, _SWA = ("compressed_sparse_attention", "heavily_compressed_attention",
                    "sliding_attention")
_DEEPSEEK_V4 = dict(model_type="deepseek_v4", rms_norm_eps=1e-6, rope_theta=10000.0,
                    compress_rope_theta=160000.0,
                    scoring_func="sqrtsoftplus", swiglu_limit=10.0, hc_mult=4,
                    hc_sinkhorn_iters=20, hc_eps=1e-6)
_V4_YARN = dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=65536,
                beta_fast=32, beta_slow=1)
_QWEN3_MOE = dict(model_type="qwen3_moe", rms_norm_eps=1e-6, rope_theta=1000000.0,
                  norm_topk_prob=True)
_MIXTRAL = dict(model_type="mixtral", rms_norm_eps=1e-5, rope_theta=1000000.0,
                sliding_window=None)

DUMMY_PRESETS: dict[str, dict[str, Any]] = {
    # a Llama-2-7B shape: MHA, 32 layers, 4096 hidden; then with a 32k context, for
    # long-context benchmarks
    "llama-7b": _shape(4096, 11008, 32, 32, 32, 32000, 4096, **_LLAMA),
    "llama-7b-32k": _shape(4096, 11008, 32, 32, 32, 32000, 32768, **_LLAMA),
    "llama3-8b": _shape(4096, 14336, 32, 32, 8, 128256, 8192, **_LLAMA3,
                        rope_scaling=_llama3_rope(8.0)),
    # the Llama-3.2-1B shape: 64-dim heads, 8 KV heads, the LM head tied to the embedding
    # (its real context of 131072 is capped like llama3-8b's, so per-row tables stay small)
    "llama3-1b": _shape(2048, 8192, 16, 32, 8, 128256, 8192, **_LLAMA3,
                        tie_word_embeddings=True, rope_scaling=_llama3_rope(32.0)),
    # DeepSeek-V2-Lite: 64 routed experts + 2 shared
    "deepseek-v2-lite": _shape(2048, 10944, 27, 16, 16, 102400, 8192, **_DEEPSEEK_V2,
                               kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                               v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
                               num_experts_per_tok=6, moe_intermediate_size=1408),
    # DeepSeek-V4-Flash's shape (config.json of deepseek-ai/DeepSeek-V4-Flash) with its 43
    # layers cut to its first 6 (2 sliding-window, then CSA / HCA alternating; 3 hash-routed
    # MoE): 256 experts of 2048 are ~13 GB a layer in bf16, so the whole model would not fit
    # one H200; context capped at 65,536 (its real one is 1,048,576)
    "deepseek-v4-flash": _shape(4096, 2048, 6, 64, 1, 129280, 65536, **_DEEPSEEK_V4,
                                head_dim=512, q_lora_rank=1024, partial_rotary_factor=0.125,
                                o_groups=8, o_lora_rank=1024, sliding_window=128,
                                layer_types=[_SWA, _SWA, _CSA, _HCA, _CSA, _HCA],
                                mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3,
                                compress_rates={_CSA: 4, _HCA: 128}, index_n_heads=64,
                                index_head_dim=128, index_topk=512, n_routed_experts=256,
                                n_shared_experts=1, num_experts_per_tok=6,
                                routed_scaling_factor=1.5,
                                rope_parameters=_V4_YARN),
    # Qwen3-30B-A3B: Qwen3 attention (128-dim heads, 4 KV heads), 128 experts, top 8, on
    # every layer (its real context of 40960 is capped to 32768)
    "qwen3-30b-a3b": _shape(2048, 6144, 48, 32, 4, 151936, 32768, **_QWEN3_MOE, head_dim=128,
                            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                            decoder_sparse_step=1, mlp_only_layers=[]),
    # Mixtral-8x7B, all 32 layers: 46.7B parameters, 93 GB in bf16, leave an H200 ~40 GB of KV
    "mixtral-8x7b": _shape(4096, 14336, 32, 32, 8, 32000, 32768, **_MIXTRAL,
                           num_local_experts=8, num_experts_per_tok=2),
    # small shapes for tests
    "qwen3-moe-tiny": _shape(256, 512, 3, 4, 2, 1024, 2048, **_QWEN3_MOE, head_dim=32,
                             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                             mlp_only_layers=[1]),
    "mixtral-tiny": _shape(256, 256, 2, 8, 2, 1024, 2048, **_MIXTRAL, num_local_experts=4,
                           num_experts_per_tok=2),
    "deepseek-tiny": _shape(256, 512, 2, 4, 4, 1024, 2048, **_DEEPSEEK_V2, kv_lora_rank=64,
                            qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
                            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                            moe_intermediate_size=128),
    "deepseek-v4-tiny": _shape(256, 128, 4, 4, 1, 1024, 2048, **_DEEPSEEK_V4, head_dim=64,
                               q_lora_rank=64, partial_rotary_factor=0.25, o_groups=2,
                               o_lora_rank=64, sliding_window=16,
                               layer_types=[_SWA, _CSA, _HCA, _CSA],
                               mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                               compress_rates={_CSA: 4, _HCA: 16}, index_n_heads=4,
                               index_head_dim=32, index_topk=8, n_routed_experts=8,
                               n_shared_experts=1, num_experts_per_tok=2,
                               routed_scaling_factor=1.5),
    "tiny": _shape(256, 512, 2, 8, 2, 1024, 2048, **_LLAMA),
    # a draft model for `tiny` (its vocabulary, 1/16 of its width)
    "tiny-draft": _shape(64, 128, 1, 2, 1, 1024, 2048, **_LLAMA),
    # a target and a draft of 8% its parameters (107M and 8.7M) for speculative decoding
    "spec-target": _shape(1024, 2816, 8, 16, 4, 8192, 4096, **_LLAMA),
    "spec-draft": _shape(256, 768, 6, 4, 1, 8192, 4096, **_LLAMA),
}
