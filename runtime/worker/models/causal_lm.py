"""The skeleton every decoder family shares: embedding, a stack of pre-norm decoder layers,
final norm and LM head (`CausalLM`), with the hooks a family fills in.

A family subclasses `CausalLM` and says how to build one layer (`decoder_layer`: its
attention and its feed-forward block), which RoPE table its ops use (`rope_table`), how its
fused or stacked parameters are filled from checkpoint tensors (`checkpoint_pieces`) and
which checkpoint tensors are cut along which dim under tensor parallelism
(`COLUMN_PARALLEL`, `ROW_PARALLEL`). The rest (the forward over the layers, the
vocab-parallel embedding and LM head, logits gathered over the TP group, the map from
checkpoint names to parameter rows) lives here once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.parallel import VocabParallelEmbedding
from runtime.worker.ops import TorchOps, TritonOps, ops_for
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup

Ops = TorchOps | TritonOps
# (checkpoint tensor name relative to the parameter's parent module, first row, row count)
Piece = tuple[str, int, int]
# (our parameter name, first row, row count) a checkpoint tensor fills
Target = tuple[str, int, int]


class RMSNorm(nn.Module):
    """The weight and epsilon of one RMSNorm; the model applies it with `ops.rmsnorm`."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class DecoderLayer(nn.Module):
    """Pre-norm attention then pre-norm feed-forward, each added to the residual stream.
    `self_attn(x, ops, fb, attn)` and `mlp(x, ops)` map `[T, hidden]` to `[T, hidden]`."""

    def __init__(self, hidden: int, eps: float, self_attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, ops: Ops, fb: ForwardBatch,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(this layer's feed-forward output, the residual stream before it): [T, hidden] each."""
        norm = self.input_layernorm
        if residual is None:
            x, residual = ops.rmsnorm(h, norm.weight, norm.eps), h
        else:
            x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
        h = self.self_attn(x, ops, fb, attn)  # [T, hidden]
        norm = self.post_attention_layernorm
        x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)
        return self.mlp(x, ops), residual


class Decoder(nn.Module):
    """Vocab-parallel embedding, the layers, the final norm (transformers' `model.`)."""

    def __init__(self, vocab: int, hidden: int, eps: float, tp: TPGroup,
                 layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(vocab, hidden, tp)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps)
        self.ops: Ops | None = None  # set by `CausalLM.init_buffers` once the device is known

    def forward(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        return self.run(fb, attn)[0]

    def run(self, fb: ForwardBatch, attn: AttentionBackend, capture: tuple[int, ...] = (),
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(the final-normed hidden states [T, hidden], the residual stream after `i`
        layers for each i of `capture` in its order, [T, hidden] each; i in 1..layers)."""
        ops = self.ops
        h, residual = self.embed_tokens(fb.input_ids), None  # [T, hidden]
        streams = {}
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, ops, fb, attn)  # [T, hidden] each
            if i + 1 in capture:
                streams[i + 1] = h + residual  # [T, hidden]
        out = ops.add_rmsnorm(h, residual, self.norm.weight, self.norm.eps)[0]
        return out, [streams[i] for i in capture]


class CausalLM(nn.Module):
    """Decoder plus LM head (or the embedding, tied). `arch` is the family's shape record
    (it has at least vocab_size, hidden_size, num_layers, rms_norm_eps and
    tie_word_embeddings); `tp` this rank's place in the tensor-parallel group;
    `quantization` the storage of the projections' weights, kept as `quant`: "none", "fp8"
    (quantized at load) or a checkpoint's `QuantScheme`."""

    MODEL_TYPES: ClassVar[tuple[str, ...]] = ()  # transformers `model_type`s of the family
    ARCH: ClassVar[type]  # the shape record, with a `from_hf(config)` constructor
    WEIGHT_FORMATS: ClassVar[tuple[str, ...]] = ("none",)  # the `QuantScheme.weights` it runs
    # checkpoint modules cut along their output rows (dim 0) or input columns (dim 1) under TP
    COLUMN_PARALLEL: ClassVar[tuple[str, ...]] = ("q_proj", "gate_proj", "up_proj",
                                                  "embed_tokens", "lm_head")
    ROW_PARALLEL: ClassVar[tuple[str, ...]] = ("o_proj", "down_proj")
    # (our module name, the checkpoint's) where they differ, for whole path components
    MODULE_RENAMES: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, arch, tp: TPGroup | None = None,
                 quantization: QuantScheme | str = "none") -> None:
        super().__init__()
        self.quant = QuantScheme.of(quantization)  # ValueError for an unknown name
        if self.quant.weights not in self.WEIGHT_FORMATS:
            raise NotImplementedError(f"{'/'.join(self.MODEL_TYPES)}: {self.quant.weights} "
                                      "weights are not supported yet")
        self.arch = arch
        self.quantization = self.quant.name  # "none" or "fp8", as /get_model_info reports
        self.tp = tp = tp or TPGroup()
        layers = [self.decoder_layer(i) for i in range(arch.num_layers)]
        self.model = Decoder(arch.vocab_size, arch.hidden_size, arch.rms_norm_eps, tp, layers)
        if not arch.tie_word_embeddings:
            self.lm_head = nn.Linear(
                arch.hidden_size, tp.shard(arch.vocab_size, "the vocabulary"), bias=False
            )

    @classmethod
    def from_hf(cls, config, tp: TPGroup | None = None, quantization: str = "none") -> CausalLM:
        """The model a transformers config describes (this rank's shard under `tp`), its
        weights stored as the config's `quantization_config` says, else as `quantization`
        (the --quantization flag) asks."""
        return cls(cls.ARCH.from_hf(config), tp, QuantScheme.from_config(config, quantization))

    def decoder_layer(self, layer_id: int) -> DecoderLayer:
        """Layer `layer_id` of this family, this rank's shard (self.arch, self.tp and
        self.quant are set)."""
        raise NotImplementedError

    def rope_table(self, device: torch.device) -> torch.Tensor:
        """The RoPE cos/sin table the ops rotate with: [max_position, rotary dim] fp32."""
        raise NotImplementedError

    def forward(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Final-normed hidden states of every new token: [T, hidden]."""
        return self.model(fb, attn)

    def forward_features(self, fb: ForwardBatch, attn: AttentionBackend,
                         capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-normed hidden states [T, hidden], the features a draft head reads
        [T, w]): with `capture` empty the final hidden states themselves (w = hidden),
        else the residual streams after those numbers of layers, concatenated
        (`Decoder.run`; w = len(capture) * hidden)."""
        hidden, streams = self.model.run(fb, attn, capture)
        return hidden, torch.cat(streams, dim=-1) if streams else hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head over selected rows: [S, hidden] -> [S, vocab] float32."""
        head = self.model.embed_tokens if self.arch.tie_word_embeddings else self.lm_head
        logits = F.linear(hidden, head.weight)  # [S, vocab / tp], this rank's rows
        return self.tp.all_gather_last(logits).float()  # [S, vocab]

    def prefix_rule(self) -> tuple[int, int]:
        """(align, replay): the scheduler rounds prefix hits down to a multiple of `align`
        and computes their last `replay` tokens again (a model whose state of a prefix is
        not all in the pool's rows rebuilds it so); any hit serves here: (1, 0)."""
        return 1, 0

    def bind_rows(self, rows: list[int]) -> None:
        """Rows `rows` of the request table serve new requests: a model keeping state per
        request row forgets theirs (there is none here)."""

    def init_buffers(self) -> None:
        """Once the weights are in: the ops (Triton on CUDA, torch references elsewhere)
        with the RoPE table. Families extend it with their own post-load steps."""
        device = self.model.embed_tokens.weight.device
        self.model.ops = ops_for(device, self.rope_table(device))

    def tp_split_dim(self, hf_name: str) -> int | None:
        """The dim along which checkpoint tensor `hf_name` is split over TP ranks; None
        when every rank holds all of it (norms, routers, biases of row-parallel layers)."""
        *_, module, leaf = hf_name.split(".")
        if module in self.COLUMN_PARALLEL:
            return 0
        if module in self.ROW_PARALLEL and leaf == "weight":
            return 1
        return None

    def checkpoint_pieces(self, module: str, leaf: str, param: torch.Tensor) -> list[Piece]:
        """The checkpoint tensors that fill parameter `leaf` of our module `module`, named
        relative to its parent module. By default one tensor of the same name; a fused
        `gate_up_proj` takes `gate_proj` then `up_proj`."""
        rows = param.shape[0]
        if module == "gate_up_proj":
            return [(f"gate_proj.{leaf}", 0, rows // 2), (f"up_proj.{leaf}", rows // 2, rows // 2)]
        return [(f"{module}.{leaf}", 0, rows)]

    def checkpoint_targets(self) -> dict[str, Target]:
        """Every tensor a transformers checkpoint must provide, by its name there:
        (our parameter name, first row, row count) along dim 0 of that parameter. Under TP
        the rows are this rank's share of the tensor cut by `tp_split_dim`."""
        return checkpoint_targets(self, self.checkpoint_pieces, self.MODULE_RENAMES)

    def checkpoint_name(self, name: str) -> str | None:
        """The name of checkpoint tensor `name` in the layout `checkpoint_targets` speaks, or
        None for a tensor the model does not use. Families whose releases name their
        tensors otherwise override it."""
        return name


def checkpoint_targets(module: nn.Module, pieces: Callable[[str, str, torch.Tensor], list[Piece]],
                       renames: tuple[tuple[str, str], ...] = ()) -> dict[str, Target]:
    """`CausalLM.checkpoint_targets` of any module: each of its parameters filled from the
    checkpoint tensors `pieces(module, leaf, param)` names, under its parents' names
    (`renames`: ours -> the checkpoint's, for whole path components)."""
    renamed = dict(renames)
    targets: dict[str, Target] = {}
    for name, param in module.named_parameters():
        *parent, leaf_module, leaf = name.split(".")
        prefix = ".".join(renamed.get(p, p) for p in parent)
        for hf_name, start, rows in pieces(leaf_module, leaf, param):
            targets[f"{prefix}.{hf_name}" if prefix else hf_name] = (name, start, rows)
    return targets
