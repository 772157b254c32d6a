"""Llama-family decoder: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm).

Tokens of all sequences run flattened as one `[T, hidden]` stream; only attention looks at
sequence boundaries, through the attention backend and the ForwardBatch. Q/K/V and gate/up
projections are fused into one linear each (the loader concatenates the HF weights).

Under tensor parallelism (`TPGroup` of size N) each rank holds 1/N of every layer, as
Megatron-LM splits it: Q/K/V and gate/up column-parallel (whole heads, whole MLP columns),
O and down row-parallel (all-reduced), the embedding and the LM head by vocabulary rows
(`parallel.py`). `CausalLM.tp_split_dim` says how each checkpoint tensor is cut. The
feed-forward block of a layer comes from `LlamaForCausalLM.mlp`, which the mixture-of-experts
families (`llama_moe.py`) override.

With `quantization="fp8"` the projections of every layer hold fp8 weights (`Fp8Linear`), and
an fp8 checkpoint's `QuantScheme` keeps them as it ships them (per-channel or block scales);
the embedding, the LM head and the norms stay in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from kernels.norm_rope.rope import ROPE_TYPES, rope_cos_sin_cache
from runtime.worker.attention import AttentionBackend, Rotary
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.causal_lm import CausalLM, DecoderLayer, Ops, Piece, RMSNorm
from runtime.worker.models.parallel import column_linear, row_linear
from runtime.worker.quant.scheme import WEIGHTS, QuantScheme
from runtime.worker.tp import TPGroup

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")  # per-head RMSNorm of q and k before RoPE
WINDOWED_TYPES = ("mistral", "mixtral")  # `sliding_window` applies without a switch


@dataclass(frozen=True)
class LlamaArch:
    """The shape of a Llama-family model, read from a transformers config."""

    MODEL_TYPES: ClassVar[tuple[str, ...]] = SUPPORTED_TYPES

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta and scaling parameters
    sliding_window: int | None = None  # not implemented: caps the usable context instead
    max_position: int = 4096

    @classmethod
    def from_hf(cls, config) -> LlamaArch:
        """Read a transformers config (4.x `rope_scaling`/`rope_theta` or 5.x `rope_parameters`)."""
        return cls(**cls.hf_fields(config))

    @classmethod
    def hf_fields(cls, config) -> dict:
        """The constructor's arguments, from a transformers config."""
        kind = getattr(config, "model_type", "llama")
        if kind not in cls.MODEL_TYPES:
            raise NotImplementedError(f"model_type {kind!r}; supported: {cls.MODEL_TYPES}")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {config.hidden_act!r}; only silu")
        heads = config.num_attention_heads
        bias = bool(getattr(config, "attention_bias", False))
        rope = dict(
            getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        )
        rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
        rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
        if rope["rope_type"] not in ROPE_TYPES or rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise NotImplementedError(f"rope {rope}; supported types: {ROPE_TYPES}")
        window = getattr(config, "sliding_window", None)
        windowed = (
            kind in WINDOWED_TYPES
            or getattr(config, "use_sliding_window", False)
            or "sliding_attention" in (getattr(config, "layer_types", None) or [])
        )
        return dict(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=bias or kind == "qwen2",
            o_bias=bias and kind != "qwen2",
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=kind in QK_NORM_TYPES,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            rope=rope,
            sliding_window=window if windowed else None,
            max_position=getattr(config, "max_position_embeddings", 4096),
        )


class LlamaAttention(nn.Module):
    """`input_size` (default: the hidden size) is the width the q/k/v projection reads."""

    def __init__(self, arch: LlamaArch, layer_id: int, tp: TPGroup,
                 quantization: QuantScheme, input_size: int | None = None) -> None:
        super().__init__()
        hf = f"model.layers.{layer_id}.self_attn"  # the checkpoint's module names
        self.layer_id = layer_id
        self.num_heads = tp.shard(arch.num_heads, "attention heads")  # this rank's
        self.num_kv_heads = tp.shard(arch.num_kv_heads, "KV heads")
        self.head_dim = arch.head_dim
        q_size, kv_size = self.num_heads * arch.head_dim, self.num_kv_heads * arch.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = column_linear(input_size or arch.hidden_size, q_size + 2 * kv_size,
                                      arch.qkv_bias,
                                      quantization, [f"{hf}.{m}_proj" for m in "qkv"])
        self.o_proj = row_linear(q_size, arch.hidden_size, arch.o_bias, tp, quantization,
                                 [f"{hf}.o_proj"])
        if arch.qk_norm:
            self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps)
            self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps)
        self.qk_norm = arch.qk_norm

    def forward(
        self, x: torch.Tensor, ops: Ops, fb: ForwardBatch, attn: AttentionBackend
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)  # [T, Hq*D], [T, Hkv*D] x2
        q = q.reshape(tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        if attn.fuses_rope:  # q/k norm and RoPE run inside the backend's KV store
            out = attn.forward_rotary(self.layer_id, q, k, v, fb, self.rotary(ops))
            return self.o_proj(out.reshape(tokens, -1))  # [T, hidden]
        if self.qk_norm:  # per head, over head_dim
            q = ops.rmsnorm(q, self.q_norm.weight, self.q_norm.eps)  # [T, Hq, D]
            k = ops.rmsnorm(k, self.k_norm.weight, self.k_norm.eps)  # [T, Hkv, D]
        q, k = ops.rope(q, k, fb.positions)
        out = attn.forward(self.layer_id, q, k, v, fb)  # [T, Hq, D]
        return self.o_proj(out.reshape(tokens, -1))  # [T, hidden]


    def rotary(self, ops: Ops) -> Rotary:
        """This layer's q/k treatment before attention, for a backend that fuses it."""
        if not self.qk_norm:
            return Rotary(ops.cos_sin_cache)
        return Rotary(ops.cos_sin_cache, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)


class LlamaMLP(nn.Module):
    def __init__(self, arch: LlamaArch, layer_id: int, tp: TPGroup,
                 quantization: QuantScheme) -> None:
        super().__init__()
        hf = f"model.layers.{layer_id}.mlp"
        inter = tp.shard(arch.intermediate_size, "the MLP intermediate size")
        self.gate_up_proj = column_linear(arch.hidden_size, 2 * inter, arch.mlp_bias,
                                          quantization, [f"{hf}.gate_proj", f"{hf}.up_proj"])
        self.down_proj = row_linear(inter, arch.hidden_size, arch.mlp_bias, tp, quantization,
                                    [f"{hf}.down_proj"])

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        # silu(gate) * up, inside the down projection's loads at a one-row decode step
        return self.down_proj(self.gate_up_proj(x), gate_act=ops.silu_mul)  # [T, hidden]


class LlamaForCausalLM(CausalLM):
    """Decoder plus LM head. Parameter names follow transformers except the fused
    `qkv_proj` / `gate_up_proj`; see `checkpoint_targets`. `quantization` is "none", "fp8"
    (fp8 projection weights, quantized at load) or a checkpoint's `QuantScheme`."""

    MODEL_TYPES = SUPPORTED_TYPES
    ARCH = LlamaArch
    WEIGHT_FORMATS = WEIGHTS
    COLUMN_PARALLEL = (*CausalLM.COLUMN_PARALLEL, "k_proj", "v_proj")

    def decoder_layer(self, layer_id: int) -> DecoderLayer:
        a = self.arch
        attn = LlamaAttention(a, layer_id, self.tp, self.quant)
        return DecoderLayer(a.hidden_size, a.rms_norm_eps, attn, self.mlp(layer_id))

    def mlp(self, layer_id: int) -> nn.Module:
        """The feed-forward block of layer `layer_id`: `mlp(x, ops)`, [T, hidden] -> [T, hidden]."""
        return LlamaMLP(self.arch, layer_id, self.tp, self.quant)

    def rope_table(self, device: torch.device) -> torch.Tensor:
        a = self.arch
        return rope_cos_sin_cache(a.head_dim, a.max_position, a.rope["rope_theta"], a.rope, device)

    def checkpoint_pieces(self, module: str, leaf: str, param: torch.Tensor) -> list[Piece]:
        """The fused `qkv_proj` takes q_proj, k_proj, v_proj rows (this rank's heads)."""
        if module != "qkv_proj":
            return super().checkpoint_pieces(module, leaf, param)
        attn = self.model.layers[0].self_attn
        q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        return [(f"q_proj.{leaf}", 0, q), (f"k_proj.{leaf}", q, kv), (f"v_proj.{leaf}", q + kv, kv)]
