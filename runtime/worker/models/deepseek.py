"""DeepSeek-V2/V3 decoder: multi-head latent attention (MLA) and mixture-of-experts FFNs.

MLA runs in the absorbed form. Each token stores one latent row per layer (the normed
`c_kv` of kv_lora_rank values, then the rotated rope key of qk_rope_head_dim values),
never per-head K/V. With kv_b_proj split per head into W_UK `[H, nope, L]` and W_UV
`[H, v, L]` at load, a query's nope part is folded through W_UK into the latent space
(`q_nope @ W_UK`: `[T, H, L]`), attention runs over the latent rows (keys: the whole
row; values: its first L columns), and W_UV maps the `[T, H, L]` result to per-head values
before o_proj. Scores equal the expanded form's: q_nope . (W_UK c) = (q_nope W_UK) . c.

Checkpoints lay the rope dims out in interleaved pairs; the loader permutes the rows that
produce q_rope and k_rope so the rotate-half RoPE of `ops.rope` applies unchanged.
Under tensor parallelism (`TPGroup` of size N) each rank holds 1/N of the heads (q and
kv_b_proj rows, o_proj columns, all-reduced) and of every FFN's width (experts included,
`sparse_moe.py`); the latent projections, norms and router are replicated, and so is the
latent pool: every rank stores each token's whole latent row.

fp8 weights (`--quantization fp8`, or an fp8 checkpoint's `QuantScheme`) apply to the MLA
projections but kv_b_proj, to the dense MLPs and to the shared experts. kv_b_proj (split into
W_UK / W_UV), the router and the routed experts (the fused MoE kernel reads 16-bit weights)
stay in the model's dtype: an fp8 checkpoint's are dequantized at load.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.worker.attention import AttentionBackend
from runtime.worker.attention_mla import MlaShape
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.causal_lm import CausalLM, DecoderLayer, Ops, Piece, RMSNorm
from runtime.worker.models.deepseek_arch import SUPPORTED_TYPES, DeepseekArch
from runtime.worker.models.deepseek_moe import DeepseekMoE, GatedMLP
from runtime.worker.models.deepseek_rope import (
    deepseek_cos_sin_cache,
    deinterleave_perm,
    permute_output_rows,
)
from runtime.worker.models.parallel import column_linear, row_linear
from runtime.worker.models.sparse_moe import expert_pieces
from runtime.worker.quant.scheme import WEIGHTS, QuantScheme
from runtime.worker.tp import TPGroup


class DeepseekAttention(nn.Module):
    """MLA of one layer in the absorbed form: this rank's heads attend over the latent pool
    row of every position; kv_b_proj is kept for the checkpoint and split into W_UK / W_UV."""

    def __init__(self, arch: DeepseekArch, layer_id: int, tp: TPGroup,
                 quantization: QuantScheme) -> None:
        super().__init__()
        self.arch, self.layer_id = arch, layer_id
        self.num_heads = h = tp.shard(arch.num_heads, "attention heads")  # this rank's
        hid, hf = arch.hidden_size, f"model.layers.{layer_id}.self_attn"

        def linear(name: str, in_features: int, out_features: int) -> nn.Module:
            return column_linear(in_features, out_features, False, quantization, [f"{hf}.{name}"])

        if arch.q_lora_rank is None:
            self.q_proj = linear("q_proj", hid, h * arch.qk_head_dim)
        else:
            self.q_a_proj = linear("q_a_proj", hid, arch.q_lora_rank)
            self.q_a_layernorm = RMSNorm(arch.q_lora_rank, arch.rms_norm_eps)
            self.q_b_proj = linear("q_b_proj", arch.q_lora_rank, h * arch.qk_head_dim)
        self.kv_a_proj_with_mqa = linear("kv_a_proj_with_mqa", hid, arch.latent_dim)
        self.kv_a_layernorm = RMSNorm(arch.kv_lora_rank, arch.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            arch.kv_lora_rank, h * (arch.qk_nope_head_dim + arch.v_head_dim), bias=False
        )  # always 16-bit: only its per-head split (`absorb`) computes
        self.o_proj = row_linear(h * arch.v_head_dim, hid, False, tp, quantization,
                                 [f"{hf}.o_proj"])
        self.w_uk: torch.Tensor | None = None  # [H, nope, L], set by `absorb`
        self.w_uv_t: torch.Tensor | None = None  # [H, L, v], set by `absorb`

    def q_out(self) -> nn.Module:
        """The projection whose output rows are the per-head queries: [H * qk, in]."""
        return self.q_proj if self.arch.q_lora_rank is None else self.q_b_proj

    def after_load(self) -> None:
        """Once the weights are in: the rope rows permuted to halves (interleaved
        checkpoints), then W_UK / W_UV split out. Call it once."""
        if self.arch.rope_interleave:
            self.deinterleave_rope()
        self.absorb()

    @torch.no_grad()
    def absorb(self) -> None:
        """Split kv_b_proj into W_UK and W_UV (once the weights are in)."""
        a = self.arch
        w = self.kv_b_proj.weight.view(self.num_heads, a.qk_nope_head_dim + a.v_head_dim, -1)
        self.w_uk = w[:, : a.qk_nope_head_dim].contiguous()  # [H, nope, L]
        self.w_uv_t = w[:, a.qk_nope_head_dim :].transpose(1, 2).contiguous()  # [H, L, v]

    def deinterleave_rope(self) -> None:
        """Permute the rope rows of the q and kv_a projections from pairs to halves."""
        a = self.arch
        perm = deinterleave_perm(a.qk_rope_head_dim)
        q = torch.arange(self.num_heads * a.qk_head_dim).view(self.num_heads, a.qk_head_dim)
        q[:, a.qk_nope_head_dim :] = q[:, a.qk_nope_head_dim :][:, perm]  # [H, qk]
        permute_output_rows(self.q_out(), q.flatten())
        kv = torch.arange(a.latent_dim)  # [L + Dr]
        kv[a.kv_lora_rank :] = kv[a.kv_lora_rank :][perm]
        permute_output_rows(self.kv_a_proj_with_mqa, kv)

    def forward(
        self, x: torch.Tensor, ops: Ops, fb: ForwardBatch, attn: AttentionBackend
    ) -> torch.Tensor:
        a, tokens = self.arch, x.shape[0]
        if a.q_lora_rank is None:
            q = self.q_proj(x)  # [T, H * qk]
        else:
            norm = self.q_a_layernorm
            q = self.q_b_proj(ops.rmsnorm(self.q_a_proj(x), norm.weight, norm.eps))
        q = q.view(tokens, self.num_heads, a.qk_head_dim)  # [T, H, qk]
        q_nope, q_rope = q.split([a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split(
            [a.kv_lora_rank, a.qk_rope_head_dim], dim=-1
        )  # [T, L], [T, Dr]
        norm = self.kv_a_layernorm
        c_kv = ops.rmsnorm(c_kv, norm.weight, norm.eps)  # [T, L]
        q_rope, k_rope = ops.rope(q_rope, k_rope[:, None, :], fb.positions)  # [T, H|1, Dr]
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_uk)  # [H, T, L]
        q = torch.cat([q_latent.transpose(0, 1), q_rope], dim=-1)  # [T, H, L + Dr]
        latent = torch.cat([c_kv[:, None, :], k_rope], dim=-1)  # [T, 1, L + Dr]
        o = attn.forward(self.layer_id, q, latent, None, fb)  # [T, H, L]
        v = torch.bmm(o.transpose(0, 1), self.w_uv_t)  # [H, T, v]
        return self.o_proj(v.transpose(0, 1).reshape(tokens, -1))  # [T, hidden]


class DeepseekForCausalLM(CausalLM):
    """Decoder plus LM head, for DeepseekV2ForCausalLM / DeepseekV3ForCausalLM checkpoints.
    Parameter names follow transformers except the fused `gate_up_proj`s and the stacked
    routed experts (`checkpoint_targets`). The KV pool it needs holds one latent row per
    token and layer: `mla` says its shape to the attention backend. Under TP the latent
    projections, norms and router are replicated."""

    MODEL_TYPES = SUPPORTED_TYPES
    ARCH = DeepseekArch
    WEIGHT_FORMATS = WEIGHTS
    COLUMN_PARALLEL = (*CausalLM.COLUMN_PARALLEL, "q_b_proj", "kv_b_proj")

    def __init__(self, arch: DeepseekArch, tp: TPGroup | None = None,
                 quantization: QuantScheme | str = "none") -> None:
        super().__init__(arch, tp, quantization)
        heads = self.model.layers[0].self_attn.num_heads  # this rank's
        self.mla = MlaShape(heads, arch.kv_lora_rank, arch.sm_scale)

    def decoder_layer(self, layer_id: int) -> DecoderLayer:
        a, tp, quant = self.arch, self.tp, self.quant
        hf = f"model.layers.{layer_id}.mlp"  # the checkpoint's module names
        mlp = (DeepseekMoE(a, tp, quant, hf) if a.is_moe_layer(layer_id)
               else GatedMLP(a.hidden_size, a.intermediate_size, tp, quant, hf))
        attn = DeepseekAttention(a, layer_id, tp, quant)
        return DecoderLayer(a.hidden_size, a.rms_norm_eps, attn, mlp)

    def rope_table(self, device: torch.device) -> torch.Tensor:
        a = self.arch
        return deepseek_cos_sin_cache(a.qk_rope_head_dim, a.max_position, a.rope, device)

    def init_buffers(self) -> None:
        """Once the weights are in: the RoPE table, each layer's W_UK / W_UV, and (for
        interleaved checkpoints) the rope rows permuted to halves. Call it once."""
        super().init_buffers()
        for layer in self.model.layers:
            layer.self_attn.after_load()

    def checkpoint_name(self, name: str) -> str | None:
        """The layers past `num_hidden_layers` (DeepSeek-V3's multi-token-prediction layer)
        are a drafter's (`MtpHead`), not the decoder's: None."""
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and int(parts[2]) >= self.arch.num_layers:
            return None
        return name

    def checkpoint_pieces(self, module: str, leaf: str, param: torch.Tensor) -> list[Piece]:
        """The stacked routed experts take each expert's gate, up and down tensors."""
        if module == "experts":
            return expert_pieces(leaf, param, self.arch.n_routed_experts)
        return super().checkpoint_pieces(module, leaf, param)
