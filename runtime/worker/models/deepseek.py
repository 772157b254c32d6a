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
`deepseek_moe.py`); the latent projections, norms and router are replicated, and so is the
latent pool: every rank stores each token's whole latent row.

fp8 weights (`--quantization fp8`, or an fp8 checkpoint's `QuantScheme`) apply to the MLA
projections but kv_b_proj, to the dense MLPs and to the shared experts. kv_b_proj (split into
W_UK / W_UV), the router and the routed experts (the fused MoE kernel reads 16-bit weights)
stay in the model's dtype: an fp8 checkpoint's are dequantized at load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.attention import AttentionBackend
from runtime.worker.attention_mla import MlaShape
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.deepseek_arch import DeepseekArch
from runtime.worker.models.deepseek_moe import DeepseekMoE, GatedMLP
from runtime.worker.models.deepseek_rope import (
    deepseek_cos_sin_cache,
    deinterleave_perm,
    permute_output_rows,
)
from runtime.worker.models.llama import RMSNorm
from runtime.worker.models.parallel import VocabParallelEmbedding, column_linear, row_linear
from runtime.worker.ops import TorchOps, TritonOps
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup

Ops = TorchOps | TritonOps
# checkpoint modules cut along their output rows (dim 0) or input columns (dim 1) under TP
COLUMN_PARALLEL = ("q_proj", "q_b_proj", "kv_b_proj", "gate_proj", "up_proj", "embed_tokens",
                   "lm_head")
ROW_PARALLEL = ("o_proj", "down_proj")


def tp_split_dim(hf_name: str) -> int | None:
    """The dim along which tensor `hf_name` of a checkpoint is split over TP ranks; None
    when every rank holds all of it (latent projections, norms, the router)."""
    module = hf_name.split(".")[-2]
    return 0 if module in COLUMN_PARALLEL else 1 if module in ROW_PARALLEL else None


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


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, arch: DeepseekArch, layer_id: int, tp: TPGroup,
                 quantization: QuantScheme) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = DeepseekAttention(arch, layer_id, tp, quantization)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        hf = f"model.layers.{layer_id}.mlp"
        self.mlp = (
            DeepseekMoE(arch, tp, quantization, hf) if arch.is_moe_layer(layer_id)
            else GatedMLP(arch.hidden_size, arch.intermediate_size, tp, quantization, hf)
        )  # fmt: skip

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, ops: Ops, fb: ForwardBatch,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(this layer's FFN output, the residual stream before it): [T, hidden] each."""
        norm = self.input_layernorm
        if residual is None:
            x, residual = ops.rmsnorm(h, norm.weight, norm.eps), h
        else:
            x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
        h = self.self_attn(x, ops, fb, attn)  # [T, hidden]
        norm = self.post_attention_layernorm
        x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
        return self.mlp(x, ops), residual


class DeepseekModel(nn.Module):
    def __init__(self, arch: DeepseekArch, tp: TPGroup, quantization: QuantScheme) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, tp)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(arch, i, tp, quantization)
                                    for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.ops: Ops | None = None  # set by init_buffers once the device is known

    def forward(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        ops = self.ops
        h, residual = self.embed_tokens(fb.input_ids), None  # [T, hidden]
        for layer in self.layers:
            h, residual = layer(h, residual, ops, fb, attn)  # [T, hidden] each
        return ops.add_rmsnorm(h, residual, self.norm.weight, self.norm.eps)[0]


class DeepseekForCausalLM(nn.Module):
    """Decoder plus LM head, for DeepseekV2ForCausalLM / DeepseekV3ForCausalLM checkpoints.
    Parameter names follow transformers except the fused `gate_up_proj`s and the stacked
    routed experts (`checkpoint_targets`). The KV pool it needs holds one latent row per
    token and layer: `mla` says its shape to the attention backend."""

    def __init__(self, arch: DeepseekArch, tp: TPGroup | None = None,
                 quantization: QuantScheme | str = "none") -> None:
        super().__init__()
        self.tp = tp = tp or TPGroup()
        self.arch = arch
        self.quant = QuantScheme.of(quantization)
        self.quantization = self.quant.name
        self.model = DeepseekModel(arch, tp, self.quant)
        heads = self.model.layers[0].self_attn.num_heads  # this rank's
        self.mla = MlaShape(heads, arch.kv_lora_rank, arch.sm_scale)
        if not arch.tie_word_embeddings:
            self.lm_head = nn.Linear(
                arch.hidden_size, tp.shard(arch.vocab_size, "the vocabulary"), bias=False
            )

    def forward(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Final-normed hidden states of every new token: [T, hidden]."""
        return self.model(fb, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head over selected rows: [S, hidden] -> [S, vocab] float32."""
        head = self.model.embed_tokens if self.arch.tie_word_embeddings else self.lm_head
        logits = F.linear(hidden, head.weight)  # [S, vocab / tp], this rank's rows
        return self.tp.all_gather_last(logits).float()  # [S, vocab]

    def init_buffers(self) -> None:
        """Once the weights are in: the RoPE table, each layer's W_UK / W_UV, and (for
        interleaved checkpoints) the rope rows permuted to halves. Call it once."""
        a = self.arch
        device = self.model.embed_tokens.weight.device
        cache = deepseek_cos_sin_cache(a.qk_rope_head_dim, a.max_position, a.rope, device)
        self.model.ops = TritonOps(cache) if device.type == "cuda" else TorchOps(cache)
        for layer in self.model.layers:
            if a.rope_interleave:
                layer.self_attn.deinterleave_rope()
            layer.self_attn.absorb()

    def checkpoint_targets(self) -> dict[str, tuple[str, int, int]]:
        """Every tensor a transformers checkpoint must provide, by its name there:
        (our parameter name, first row, row count) along dim 0 of that parameter. Under TP
        the rows are this rank's share of the tensor cut by `tp_split_dim`."""
        a = self.arch
        targets: dict[str, tuple[str, int, int]] = {}
        for name, param in self.named_parameters():
            *parent, module, leaf = name.split(".")
            prefix = ".".join(parent)
            if module == "gate_up_proj":
                inter = param.shape[0] // 2
                targets[f"{prefix}.gate_proj.{leaf}"] = (name, 0, inter)
                targets[f"{prefix}.up_proj.{leaf}"] = (name, inter, inter)
            elif module == "experts":
                e, h = a.n_routed_experts, a.hidden_size
                i = param.shape[0] // (2 * e) if leaf == "w13" else param.shape[1]  # local I
                for x in range(e):
                    if leaf == "w13":
                        targets[f"{prefix}.experts.{x}.gate_proj.weight"] = (name, x * 2 * i, i)
                        targets[f"{prefix}.experts.{x}.up_proj.weight"] = (name, x * 2 * i + i, i)
                    else:
                        targets[f"{prefix}.experts.{x}.down_proj.weight"] = (name, x * h, h)
            else:
                targets[name] = (name, 0, param.shape[0])
        return targets
