"""`MtpHead`: the multi-token-prediction (MTP) layer of a DeepSeek-V3-family checkpoint, a
`DraftHead` (`--speculative-algorithm mtp`, drafted by `HeadDrafter`).

The checkpoint keeps it as layer `num_hidden_layers` (`model.layers.{L}.*`, which the
target's loader skips): the RMSNorms `enorm` and `hnorm`, `eh_proj` [h, 2h], one decoder
layer of the model's own kind (latent attention; an MoE or dense feed-forward as the
model's layer L would have), `shared_head.norm` and, in some releases, `shared_head.head`
(else the target's LM head gives its logits). Its embedding is the target's (a copy in the
layer is not read). A step maps the embedding e of token t + 1 and the hidden state h it
follows to

    out = shared_head.norm(layer(eh_proj(concat(enorm(e), hnorm(h)))))

where h is the target's final-normed hidden state at t (the one its LM head reads), or
for a later draft step the previous step's `out` (the one the head's LM head reads). Its
entries live in a one-layer latent pool (one [L + Dr] row a slot) over the target's
slots. The weights load as the target's do (`ShardLoader`: fp8 checkpoints included),
and under tensor parallelism the layer is cut as the target's layers are (this rank's
heads and share of every FFN's width, all-reduced; eh_proj, the norms and
`shared_head.head` whole on every rank), so each rank runs its part of every draft step
in lockstep and all get the same drafts.

DeepSeek-V4's MTP layer (`mtp.*`, over hyper-connection streams) is `V4MtpHead`;
`mtp_head_class` picks the head of a target's model_type.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_config import ModelSpec
from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool
from runtime.worker.loader import build_model, load_hf_folder, materialize
from runtime.worker.model_runner import make_attention
from runtime.worker.models.causal_lm import CausalLM, DecoderLayer, RMSNorm, Target
from runtime.worker.models.causal_lm import checkpoint_targets as targets_of
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.ops import ops_for
from runtime.worker.speculative.mtp_checks import check_complete, mtp_checkpoint
from runtime.worker.speculative.mtp_v4_head import V4MtpHead
from runtime.worker.tp import TPGroup


def mtp_head_class(spec: ModelSpec) -> type[MtpHead] | type[V4MtpHead]:
    """The MTP head of target `spec`'s model_type: `V4MtpHead` for DeepSeek-V4, else
    `MtpHead` (whose `check` refuses a model_type without an implemented MTP layer)."""
    kind = getattr(spec.hf_config(), "model_type", "")
    return V4MtpHead if kind == "deepseek_v4" else MtpHead


class MtpHead(DecoderLayer):
    """The MTP layer: its decoder layer (this module's own `input_layernorm`, `self_attn`,
    `post_attention_layernorm`, `mlp`) with the parts around it, named as the checkpoint
    names them under `model.layers.{L}.`. `family`: the target's model (on the meta
    device), which builds the layer and says how its checkpoint tensors are laid out."""

    def __init__(self, family: DeepseekForCausalLM, own_head: bool) -> None:
        a = family.arch
        layer = family.decoder_layer(a.num_layers)
        super().__init__(a.hidden_size, a.rms_norm_eps, layer.self_attn, layer.mlp)
        self.index = a.num_layers
        self.self_attn.layer_id = 0  # the one layer of the head's pool
        h, eps = a.hidden_size, a.rms_norm_eps
        self.enorm, self.hnorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(h, eps)
        if own_head:
            self.shared_head.head = nn.Linear(h, a.vocab_size, bias=False)
        # what the loader reads of a model (`ShardLoader`), and the family's layout rules
        self.arch, self.tp, self.quant, self.mla = a, family.tp, family.quant, family.mla
        self.tp_split_dim, self._pieces = family.tp_split_dim, family.checkpoint_pieces
        self._rope_table = family.rope_table
        self.capture: tuple[int, ...] = ()  # it reads the target's final hidden states
        self.hidden_size = h
        self.ops = None  # set by `load`

    @property
    def prefix(self) -> str:
        return f"model.layers.{self.index}."

    @classmethod
    def check(cls, spec: ModelSpec, quantization: str = "none",
              tp: TPGroup | None = None) -> MtpHead:
        """The head on the meta device (this rank's shard under `tp`), once `spec`'s config
        and checkpoint are checked to hold an MTP layer this worker runs: raises
        `MtpUnavailable` naming the field, or the first tensor of the layer missing from
        the checkpoint."""
        config, folder, names = mtp_checkpoint(spec)
        with torch.device("meta"):
            family = build_model(config, tp, quantization)
            head_name = f"model.layers.{family.arch.num_layers}.shared_head.head.weight"
            head = cls(family, own_head=head_name in names)
        check_complete(set(head.checkpoint_targets()), names, folder, head.prefix + "*")
        return head

    @classmethod
    def load(cls, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
             quantization: str = "none", tp: TPGroup | None = None) -> MtpHead:
        """The head with its weights from `spec`'s checkpoint, in `dtype` on `device`
        (checked as `check` does); under `tp` this rank's shard, cut as the target's
        layers are."""
        head = materialize(cls.check(spec, quantization, tp), device, dtype)
        load_hf_folder(head, Path(spec.path))
        head.self_attn.after_load()
        head.ops = ops_for(device, head._rope_table(device))
        return head.eval()

    def checkpoint_targets(self) -> dict[str, Target]:
        """Every tensor of the layer the checkpoint must hold, by its name there."""
        return {self.prefix + k: v for k, v in targets_of(self, self._pieces).items()}

    def checkpoint_name(self, name: str) -> str | None:
        """The layer's tensors but the embedding's copy; None for the rest."""
        if not name.startswith(self.prefix) or name == self.prefix + "embed_tokens.weight":
            return None
        return name

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """A latent row of the head's pool and a feature row, a slot."""
        return (self.arch.latent_dim + self.hidden_size) * dtype.itemsize

    def attention(self, slots: int, backend: str, dtype: torch.dtype,
                  device: torch.device) -> AttentionBackend:
        """MLA over a new pool of one latent row a slot."""
        pool = KVPool(1, slots, 1, self.arch.latent_dim, dtype, device, planes=1)
        return make_attention(backend, pool, device, self.mla)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features  # [T, h]

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch,
                attn: AttentionBackend) -> torch.Tensor:
        """One step over `fb`'s tokens, storing the head's latent rows: embeddings [T, h]
        and the hidden states they follow [T, h] -> `out` [T, h] (normed)."""
        ops = self.ops
        x = torch.cat([ops.rmsnorm(embeds, self.enorm.weight, self.enorm.eps),
                       ops.rmsnorm(hidden, self.hnorm.weight, self.hnorm.eps)], dim=-1)
        h, residual = super().forward(self.eh_proj(x), None, ops, fb, attn)  # [T, h] x2
        norm = self.shared_head.norm
        return ops.add_rmsnorm(h, residual, norm.weight, norm.eps)[0]  # [T, h]

    def draft_ids(self, out: torch.Tensor, target: CausalLM) -> torch.Tensor:
        """Greedy ids [T] of `out` [T, h]: its own head's, else the target's LM head's."""
        head = getattr(self.shared_head, "head", None)
        if head is None:
            return target.compute_logits(out).argmax(dim=-1)  # [T]
        return F.linear(out, head.weight).argmax(dim=-1)  # [T]
