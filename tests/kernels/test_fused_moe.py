"""fused_moe (Triton) against fused_moe_ref, and fused_moe_ref against transformers' experts."""

import torch
from transformers import DeepseekV2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

from kernels.moe import fused_moe_ref, grouped_topk


def test_reference_matches_deepseek_experts():
    T, H, inter, E, k = 7, 32, 24, 8, 2
    config = DeepseekV2Config(
        hidden_size=H, num_attention_heads=4, moe_intermediate_size=inter, n_routed_experts=E
    )
    experts = DeepseekV2Experts(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(E, 2 * inter, H, generator=gen) / H**0.5)
        experts.down_proj.copy_(torch.randn(E, H, inter, generator=gen) / inter**0.5)
    x = torch.randn(T, H, generator=gen)  # [T, H]
    weights, ids = grouped_topk(torch.randn(T, E, generator=gen), k)  # [T, k] each
    want = experts(x, ids.long(), weights)
    got = fused_moe_ref(x, experts.gate_up_proj.data, experts.down_proj.data, weights, ids)
    torch.testing.assert_close(got, want)
