"""Test helper: tiny random DeepSeek-V4 transformers checkpoints (every attention type:
sliding window only, compressed sparse with its indexer, heavily compressed; hash-routed
then top-k MoE), and entry ids for a model whose ids come from a table."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, DeepseekV4Config

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
# windows, blocks and top-k far below the real ones so short prompts cross all of them; 8
# indexer heads, so that no entry scores exactly 0 (every head's relu 0) beside another:
# the top-k of a tie is arbitrary, here and in transformers
TINY_V4 = dict(
    vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=24,
    partial_rotary_factor=0.25, num_experts_per_tok=2, n_routed_experts=8, n_shared_experts=1,
    layer_types=[SWA, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
    compress_rates={CSA: 4, HCA: 8}, sliding_window=8, o_groups=2, o_lora_rank=16,
    index_n_heads=8, index_head_dim=16, index_topk=3, hc_mult=2, hc_sinkhorn_iters=5,
    max_position_embeddings=512,
)  # fmt: skip


def tiny_v4_config(**overrides) -> DeepseekV4Config:
    """The tiny config, with config fields `overrides` changed."""
    return DeepseekV4Config(**{**TINY_V4, **overrides})


def tiny_v4(folder=None, dtype: torch.dtype = torch.float32, seed: int = 0,
            **overrides) -> torch.nn.Module:
    """A random tiny DeepseekV4ForCausalLM (eval, drawn from `seed`), saved to `folder` when
    given. Every tensor is random (transformers zero-inits sinks, biases and position
    biases), and the hash router's token-to-expert table picks distinct random experts."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_v4_config(**overrides), dtype=torch.float32)
    n_exp, k = model.config.n_routed_experts, model.config.num_experts_per_tok
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:
                continue
            if name.endswith("tid2eid"):
                t.copy_(torch.rand(t.shape[0], n_exp).argsort(-1)[:, :k])
                continue
            noise = torch.randn(t.shape)
            t.copy_(1 + 0.1 * noise if "norm" in name else 0.1 * noise)
    model = model.to(dtype).eval()
    if folder is not None:
        model.save_pretrained(folder)
    return model


def interleave_entries(model, num_seqs: int) -> None:
    """Fill the entry tables of `model` (a DeepseekV4ForCausalLM whose ids the scheduler
    would hand out) as `tests.worker.batching` lays out slots: window w of the sequence
    on row s gets id 1 + w * num_seqs + s, every window the pools have ids for."""
    writes = []
    for m, n in model.entries.counts.items():
        windows = min((n - 1) // num_seqs, model.entries.req_to_entry[m].shape[1])
        writes += [(m, s, 0, [1 + w * num_seqs + s for w in range(windows)])
                   for s in range(num_seqs)]
    model.write_entries(writes)
