"""`EagleHead`: the module of a released EAGLE head (`EagleLayout`) and its loading; a
`DraftHead` (`HeadDrafter`).

A head step maps the embeddings of tokens [T, h] and the hidden states they follow
[T, h] (the target's features at the previous position, projected by `project`, or the
head's own output of the previous draft step) to its output [T, h], through one decoder
layer over the head's own KV; `draft_ids` turns outputs into greedy target token ids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.norm_rope.rope import rope_cos_sin_cache
from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool
from runtime.worker.model_runner import make_attention
from runtime.worker.models.causal_lm import CausalLM, RMSNorm
from runtime.worker.models.llama import LlamaAttention, LlamaMLP
from runtime.worker.ops import TorchOps, ops_for
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.speculative.eagle_layout import (
    EagleHeadMismatch,
    EagleLayout,
    tensor_shapes,
)
from runtime.worker.torch_bin_reader import folder_slices
from runtime.worker.tp import TPGroup

# (parameter, first row, rows) a checkpoint tensor fills
Target = tuple[torch.Tensor, int, int]


class EagleHead(nn.Module):
    """One EAGLE (v1/v2) or EAGLE-3 head (see `EagleLayout`), replicated on one device."""

    def __init__(self, layout: EagleLayout) -> None:
        super().__init__()
        self.layout = layout
        a, none, tp = layout.arch, QuantScheme.of("none"), TPGroup()
        h, eps = a.hidden_size, a.rms_norm_eps
        self.fc = nn.Linear((3 if layout.eagle3 else 2) * h, h, bias=layout.fc_bias)
        self.input_layernorm = RMSNorm(h, eps) if layout.input_norm else None
        self.self_attn = LlamaAttention(a, 0, tp, none, input_size=(2 if layout.eagle3 else 1) * h)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = LlamaMLP(a, 0, tp, none)
        if layout.eagle3:
            self.hidden_norm = RMSNorm(h, eps)
            self.norm = RMSNorm(h, eps)
            self.lm_head = nn.Linear(h, layout.draft_vocab, bias=False)
            if layout.draft_vocab < layout.target_vocab:
                self.register_buffer("d2t", torch.zeros(layout.draft_vocab, dtype=torch.int64))
        self.ops: TorchOps | None = None

    @classmethod
    def check(cls, layout: EagleLayout) -> EagleHead:
        """The head on the meta device, once the folder's tensor headers are checked to
        fill it: raises `EagleHeadMismatch` for a missing tensor or one of another shape."""
        with torch.device("meta"):
            head = cls(layout)
        head.check_shapes(tensor_shapes(layout.folder))
        return head

    @classmethod
    def load(cls, layout: EagleLayout, device: torch.device, dtype: torch.dtype) -> EagleHead:
        """The head with its weights from `layout.folder`, in `dtype` on `device` (checked
        as `check` does)."""
        head = cls.check(layout)
        head.to(dtype=dtype).to_empty(device=device).requires_grad_(False)
        targets = head.checkpoint_targets()
        for name, sl in folder_slices(layout.folder, targets.__contains__):
            param, start, rows = targets[name]
            param[start:start + rows].copy_(sl[...])
        a = layout.arch
        table = rope_cos_sin_cache(a.head_dim, layout.max_position, a.rope["rope_theta"],
                                   a.rope, device)
        head.ops = ops_for(device, table)
        return head.eval()

    def checkpoint_targets(self) -> dict[str, Target]:
        """Every tensor the head's checkpoint must hold, by its name there."""
        prefix, attn = self.layout.prefix, self.self_attn
        q, kv = attn.sizes[0], attn.sizes[1]
        targets: dict[str, Target] = {}
        for name, p in [*self.named_parameters(), *self.named_buffers()]:
            module, leaf = name.rsplit(".", 1) if "." in name else ("", name)
            if module in ("", "fc", "norm", "lm_head"):  # outside the decoder layer
                targets[name] = (p, 0, p.shape[0])
            elif module == "self_attn.qkv_proj":
                for part, start, rows in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
                    targets[f"{prefix}self_attn.{part}_proj.{leaf}"] = (p, start, rows)
            elif module == "mlp.gate_up_proj":
                half = p.shape[0] // 2
                targets[f"{prefix}mlp.gate_proj.{leaf}"] = (p, 0, half)
                targets[f"{prefix}mlp.up_proj.{leaf}"] = (p, half, half)
            else:
                targets[prefix + name] = (p, 0, p.shape[0])
        return targets

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Raise `EagleHeadMismatch` unless the checkpoint's tensor `shapes` fill the head."""
        for name, (param, _, rows) in self.checkpoint_targets().items():
            want = (rows, *param.shape[1:])
            if name not in shapes:
                raise EagleHeadMismatch(f"{self.layout.folder}: tensor {name} {want} is "
                                        "missing")
            if shapes[name] != want:
                raise EagleHeadMismatch(f"{self.layout.folder}: tensor {name} has shape "
                                        f"{shapes[name]}, the head's config needs {want}")

    @property
    def capture(self) -> tuple[int, ...]:
        return self.layout.capture

    @property
    def hidden_size(self) -> int:
        return self.layout.arch.hidden_size

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.layout.bytes_per_token(dtype)

    def attention(self, slots: int, backend: str, dtype: torch.dtype,
                  device: torch.device) -> AttentionBackend:
        """Attention over a new pool of one layer of the head's K/V heads."""
        a = self.layout.arch
        return make_attention(backend, KVPool(1, slots, a.num_kv_heads, a.head_dim, dtype,
                                              device), device)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [T, w] as the hidden states a head step reads [T, h]."""
        return self.fc(features) if self.layout.eagle3 else features

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch,
                attn: AttentionBackend) -> torch.Tensor:
        """One step over `fb`'s tokens, storing the head's KV: embeddings [T, h] and the
        hidden states they follow [T, h] -> the head's output [T, h] (pre-norm)."""
        ops = self.ops
        if self.layout.eagle3:
            residual = hidden  # [T, h]
            norm, hnorm = self.input_layernorm, self.hidden_norm
            x = torch.cat([ops.rmsnorm(embeds, norm.weight, norm.eps),
                           ops.rmsnorm(hidden, hnorm.weight, hnorm.eps)], dim=-1)  # [T, 2h]
        else:
            residual = x = self.fc(torch.cat([embeds, hidden], dim=-1))  # [T, h]
            if self.input_layernorm is not None:
                x = ops.rmsnorm(x, self.input_layernorm.weight, self.input_layernorm.eps)
        h = self.self_attn(x, ops, fb, attn)  # [T, h]
        norm = self.post_attention_layernorm
        x, residual = ops.add_rmsnorm(h, residual, norm.weight, norm.eps)  # [T, h] x2
        return self.mlp(x, ops) + residual  # [T, h]

    def draft_ids(self, out: torch.Tensor, target: CausalLM) -> torch.Tensor:
        """Greedy target token ids [T] int64 of the head's outputs `out` [T, h]: through
        the target's LM head (EAGLE v1/v2), or the head's own norm and LM head over its
        draft vocabulary, mapped to target ids by `d2t` (EAGLE-3)."""
        if not self.layout.eagle3:
            return target.compute_logits(out).argmax(dim=-1)  # [T]
        x = self.ops.rmsnorm(out, self.norm.weight, self.norm.eps)  # [T, h]
        ids = F.linear(x, self.lm_head.weight).argmax(dim=-1)  # [T] draft ids
        return ids + self.d2t[ids] if hasattr(self, "d2t") else ids
