"""Llama-family decoder: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm).

Tokens of all sequences run flattened as one `[T, hidden]` stream; only attention looks at
sequence boundaries, through the attention backend and the ForwardBatch. Q/K/V and gate/up
projections are fused into one linear each (the loader concatenates the HF weights).

Under tensor parallelism (`TPGroup` of size N) each rank holds 1/N of every layer, as
Megatron-LM splits it: Q/K/V and gate/up column-parallel (whole heads, whole MLP columns),
O and down row-parallel (all-reduced), the embedding and the LM head by vocabulary rows
(`parallel.py`). `tp_split_dim` says how each checkpoint tensor is cut.

With `quantization="fp8"` the projections of every layer hold fp8 weights (`Fp8Linear`), and
an fp8 checkpoint's `QuantScheme` keeps them as it ships them (per-channel or block scales);
the embedding, the LM head and the norms stay in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from kernels.rope import ROPE_TYPES, rope_cos_sin_cache
from runtime.worker.attention import AttentionBackend, Rotary
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.parallel import VocabParallelEmbedding, column_linear, row_linear
from runtime.worker.ops import TorchOps, TritonOps
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup

Ops = TorchOps | TritonOps

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# checkpoint modules cut along their output rows (dim 0) or input columns (dim 1) under TP
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
ROW_PARALLEL = ("o_proj", "down_proj")


def tp_split_dim(hf_name: str) -> int | None:
    """The dim along which tensor `hf_name` of a checkpoint is split over TP ranks; None
    when every rank holds all of it (norms, and the biases of row-parallel layers)."""
    *_, module, leaf = hf_name.split(".")
    if module in COLUMN_PARALLEL:
        return 0
    if module in ROW_PARALLEL and leaf == "weight":
        return 1
    return None


@dataclass(frozen=True)
class LlamaArch:
    """The shape of a Llama-family model, read from a transformers config."""

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
        kind = getattr(config, "model_type", "llama")
        if kind not in SUPPORTED_TYPES:
            raise NotImplementedError(f"model_type {kind!r}; supported: {SUPPORTED_TYPES}")
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
            kind == "mistral"
            or getattr(config, "use_sliding_window", False)
            or "sliding_attention" in (getattr(config, "layer_types", None) or [])
        )
        return cls(
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
            qk_norm=kind == "qwen3",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            rope=rope,
            sliding_window=window if windowed else None,
            max_position=getattr(config, "max_position_embeddings", 4096),
        )


class RMSNorm(nn.Module):
    """The weight and epsilon of one RMSNorm; the model applies it with `ops.rmsnorm`."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class LlamaAttention(nn.Module):
    def __init__(self, arch: LlamaArch, layer_id: int, tp: TPGroup,
                 quantization: QuantScheme) -> None:
        super().__init__()
        hf = f"model.layers.{layer_id}.self_attn"  # the checkpoint's module names
        self.layer_id = layer_id
        self.num_heads = tp.shard(arch.num_heads, "attention heads")  # this rank's
        self.num_kv_heads = tp.shard(arch.num_kv_heads, "KV heads")
        self.head_dim = arch.head_dim
        q_size, kv_size = self.num_heads * arch.head_dim, self.num_kv_heads * arch.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = column_linear(arch.hidden_size, q_size + 2 * kv_size, arch.qkv_bias,
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


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: LlamaArch, layer_id: int, tp: TPGroup,
                 quantization: QuantScheme) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = LlamaAttention(arch, layer_id, tp, quantization)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = LlamaMLP(arch, layer_id, tp, quantization)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        ops: Ops,
        fb: ForwardBatch,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it): [T, hidden] each."""
        norm = self.input_layernorm
        if residual is None:
            x, residual = ops.rmsnorm(h, norm.weight, norm.eps), h
        else:
            x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
        h = self.self_attn(x, ops, fb, attn)  # [T, hidden]
        norm = self.post_attention_layernorm
        x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
        return self.mlp(x, ops), residual


class LlamaModel(nn.Module):
    def __init__(self, arch: LlamaArch, tp: TPGroup, quantization: QuantScheme) -> None:
        super().__init__()
        self.arch = arch
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, tp)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, i, tp, quantization)
                                    for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.ops: Ops | None = None  # set by init_buffers once the device is known

    def forward(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        ops = self.ops
        h, residual = self.embed_tokens(fb.input_ids), None  # [T, hidden]
        for layer in self.layers:
            h, residual = layer(h, residual, ops, fb, attn)  # [T, hidden] each
        return ops.add_rmsnorm(h, residual, self.norm.weight, self.norm.eps)[0]


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head. Parameter names follow transformers except the fused
    `qkv_proj` / `gate_up_proj`; see `checkpoint_targets`. `quantization` is "none", "fp8"
    (fp8 projection weights, quantized at load) or a checkpoint's `QuantScheme`."""

    def __init__(self, arch: LlamaArch, tp: TPGroup | None = None,
                 quantization: QuantScheme | str = "none") -> None:
        super().__init__()
        self.arch = arch
        self.quant = QuantScheme.of(quantization)
        self.quantization = self.quant.name
        self.tp = tp = tp or TPGroup()
        self.model = LlamaModel(arch, tp, self.quant)
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
        """Fill non-persistent buffers (RoPE) after the model left the meta device."""
        device = self.model.embed_tokens.weight.device
        a = self.arch
        cache = rope_cos_sin_cache(
            a.head_dim, a.max_position, a.rope["rope_theta"], a.rope, device
        )  # [max_pos, D] fp32
        self.model.ops = TritonOps(cache) if device.type == "cuda" else TorchOps(cache)

    def checkpoint_targets(self) -> dict[str, tuple[str, int, int]]:
        """Every tensor a transformers checkpoint must provide, by its name there:
        (our parameter name, first row, row count) along dim 0 of that parameter. Under TP
        the rows are this rank's share of the tensor cut by `tp_split_dim`."""
        a, attn = self.arch, self.model.layers[0].self_attn
        q, kv = attn.num_heads * a.head_dim, attn.num_kv_heads * a.head_dim
        inter = self.model.layers[0].mlp.down_proj.weight.shape[1]
        fused = {
            "qkv_proj": [("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)],
            "gate_up_proj": [("gate_proj", 0, inter), ("up_proj", inter, inter)],
        }
        targets: dict[str, tuple[str, int, int]] = {}
        for name, param in self.named_parameters():
            *parent, module, leaf = name.split(".")
            for hf_module, start, rows in fused.get(module, [(module, 0, param.shape[0])]):
                targets[".".join([*parent, hf_module, leaf])] = (name, start, rows)
        return targets
