"""`V4MtpHead`: the multi-token-prediction (MTP) layer of a DeepSeek-V4 checkpoint
(`mtp.0.*` as released), a `DraftHead` (`--speculative-algorithm mtp`, drafted by
`HeadDrafter`).

The layer: RMSNorms `enorm`, `hnorm`; projections `e_proj`, `h_proj` [D, D] (stored as the
target's projections are: block fp8 in the FP8 release); one decoder block of the target's
own kind (`V4DecoderLayer`: hyper-connections, attention over a sliding window, a top-k
mixture of experts), named in the checkpoint as the target's layers are; its own final
hyper-connection head (`hc_head_fn`, `_base`, `_scale`), `norm` and, in some releases,
`head` (else the target's LM head gives its logits). Its embedding is the target's (a copy
in the layer, `emb.*`, is not read). A step maps the embedding e of token t + 1 (zero at
position 0) and the streams s [hc, D] it follows to

    x = h_proj(hnorm(s)) + e_proj(enorm(e))    (e's part added to every stream)
    out = block(x)                              [hc, D]

where s is the target's streams at t before its `hc_head` collapses them (the features
`DeepseekV4ForCausalLM.forward_features` gives), or for a later draft step the previous
step's `out`; its logits are `head(norm(hc_head(out)))`. So the hidden state a step reads
and writes is the streams flattened, [hc * D], and a slot costs the drafter a K=V row and
hc * D values of streams (`bytes_per_token`, counted when the pool is sized).

The block runs at the position t of the streams it reads (`HeadForward`'s positions: the
head's entries of a request are a sequence from position 0); RoPE is relative and its
window covers the tokens the target's window at t + 1 does, so that is the block at
t + 1. Its K=V rows (one `head_dim` row a slot) live in a one-layer pool over the target's
slots; a rejected draft's row is rewritten by the step that computes its position again,
as any head's. Only a sliding-window block is implemented: a compressed one would keep
entries and partial blocks by window per request row, and its windows end one position
after the target's, beyond what the target's prefix rule, entry ids and rings provide. So
config.json must say the block attends over a sliding window only
(`compress_ratios[num_hidden_layers]` 0, or `layer_types[num_hidden_layers]`), else the
head is refused (`MtpUnavailable`, naming the field). One device (`--tp 1`): under `--tp N`
the head is refused (the target runs cut over the ranks, `deepseek_v4_tp`).
"""

from __future__ import annotations

import json
from dataclasses import replace
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
from runtime.worker.models.causal_lm import CausalLM, RMSNorm, Target
from runtime.worker.models.causal_lm import checkpoint_targets as targets_of
from runtime.worker.models.deepseek_v4 import (
    DeepseekV4ForCausalLM,
    HyperHead,
    V4DecoderLayer,
    hc_params_to_fp32,
    init_layers,
    normed,
)
from runtime.worker.models.deepseek_v4_arch import SWA
from runtime.worker.models.deepseek_v4_checkpoint import MTP_LAYER, mtp_name
from runtime.worker.models.deepseek_v4_state import V4Step
from runtime.worker.models.parallel import column_linear
from runtime.worker.ops import ops_for
from runtime.worker.speculative.mtp_checks import MtpUnavailable, check_complete, mtp_checkpoint
from runtime.worker.tp import TPGroup

SLIDING = {"compress_ratios": 0, "layer_types": SWA}  # config.json's word for a window only


def check_block_kind(folder: Path, index: int) -> None:
    """`MtpUnavailable` unless `folder`'s config.json says the MTP block (entry `index` of
    `compress_ratios`, else of `layer_types`, lists longer than the decoder's) attends over
    a sliding window only."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    for field, sliding in SLIDING.items():
        kinds = raw.get(field)
        if isinstance(kinds, list) and len(kinds) > index:
            if kinds[index] != sliding:
                raise MtpUnavailable(
                    f"{path}: {field}[{index}] is {kinds[index]!r}: the MTP block's compressed "
                    f"attention is not supported, only {sliding!r} (sliding window)")
            return
    raise MtpUnavailable(f"{path}: compress_ratios has no entry {index}: the MTP block's "
                         "attention is not given (speculative_algorithm mtp)")


class V4MtpHead(nn.Module):
    """The MTP layer: its block at `model.layers.{L}` (L = num_hidden_layers, named as the
    target's layer L would be) and the parts around it under `mtp.`. `family`: the target's
    model (on the meta device), which says how its checkpoint tensors are laid out."""

    def __init__(self, family: DeepseekV4ForCausalLM, own_head: bool) -> None:
        super().__init__()
        a, quant = family.arch, family.quant
        self.index, d = a.num_layers, a.hidden_size
        block = replace(a, layer_types=(*a.layer_types, SWA),
                        mlp_layer_types=(*a.mlp_layer_types, "moe"))
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(self.index): V4DecoderLayer(
            block, self.index, quant, TPGroup())})
        m = self.mtp = nn.Module()
        m.enorm, m.hnorm, m.norm = (RMSNorm(d, a.rms_norm_eps) for _ in range(3))
        m.e_proj, m.h_proj = (column_linear(d, d, False, quant, [f"mtp.{name}"])
                              for name in ("e_proj", "h_proj"))
        m.hc_head = HyperHead(a)
        if own_head:
            m.head = nn.Linear(d, a.vocab_size, bias=False)
        # what the loader reads of a model (`ShardLoader`), and the family's layout rules
        self.arch, self.tp, self.quant = a, family.tp, quant
        self.tp_split_dim, self._pieces = family.tp_split_dim, family.checkpoint_pieces
        self.capture: tuple[int, ...] = ()  # it reads the target's final streams
        self.hidden_size = a.hc_mult * d
        self.ops = None  # set by `load`

    @property
    def block(self) -> V4DecoderLayer:
        return self.model.layers[str(self.index)]

    @classmethod
    def check(cls, spec: ModelSpec, quantization: str = "none",
              tp: TPGroup | None = None) -> V4MtpHead:
        """The head on the meta device, once `spec`'s config and checkpoint are checked to
        hold an MTP layer this worker runs (at `--tp 1`): raises `MtpUnavailable` naming
        the field, or the first tensor of the layer missing from the checkpoint."""
        config, folder, names = mtp_checkpoint(spec)
        if tp is not None and tp.size > 1:
            raise MtpUnavailable(f"{folder}: speculative_algorithm mtp runs deepseek_v4's MTP "
                                 f"layer at --tp 1 only, not --tp {tp.size}")
        with torch.device("meta"):
            family = build_model(config, tp, quantization)
            head = cls(family, own_head=f"{MTP_LAYER}head.weight" in names)
        present = {head.checkpoint_name(n) for n in names} - {None}
        if not present:
            raise MtpUnavailable(f"{folder}: no tensor {MTP_LAYER}*: the checkpoint has no MTP "
                                 "layer (speculative_algorithm mtp)")
        check_complete(set(head.checkpoint_targets()), present, folder, MTP_LAYER + "*")
        check_block_kind(folder, head.index)
        return head

    @classmethod
    def load(cls, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
             quantization: str = "none", tp: TPGroup | None = None) -> V4MtpHead:
        """The head with its weights from `spec`'s checkpoint, in `dtype` on `device`
        (checked as `check` does), set up as the target's layers are (`init_buffers`)."""
        head = materialize(cls.check(spec, quantization, tp), device, dtype)
        load_hf_folder(head, Path(spec.path))
        with torch.no_grad():
            hc_params_to_fp32(head)
            init_layers([head.block], head.arch, device)
        head.ops = ops_for(device)
        return head.eval()

    def checkpoint_targets(self) -> dict[str, Target]:
        """Every tensor of the layer the checkpoint must hold, by `checkpoint_name`."""
        return targets_of(self, self._pieces)

    def checkpoint_name(self, name: str) -> str | None:
        """The MTP layer's tensors as the head names them (`mtp_name`); None for the rest."""
        return mtp_name(name, self.index)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """A K=V row of the head's pool and a feature row (the streams), a slot."""
        return (self.arch.head_dim + self.hidden_size) * dtype.itemsize

    def attention(self, slots: int, backend: str, dtype: torch.dtype,
                  device: torch.device) -> AttentionBackend:
        """A new pool of one K=V row a slot; the block attends by itself through the
        backend's page table, as the target's layers do."""
        pool = KVPool(1, slots, 1, self.arch.head_dim, dtype, device, planes=1)
        return make_attention(backend, pool, device)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features  # [T, hc * D]

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch,
                attn: AttentionBackend) -> torch.Tensor:
        """One step over `fb`'s tokens, storing the block's rows: embeddings [T, D] and the
        streams they follow [T, hc * D] -> the block's output streams [T, hc * D]."""
        a, m = self.arch, self.mtp
        streams = hidden.view(-1, a.hc_mult, a.hidden_size)  # [T, hc, D]
        e = torch.where(fb.positions[:, None] == 0, 0.0, embeds)  # [T, D]
        h = m.h_proj(normed(streams, m.hnorm).flatten(0, 1)).view_as(streams)
        x = h + m.e_proj(normed(e, m.enorm))[:, None, :]  # [T, hc, D]
        step = V4Step.of(fb, attn.page_table(fb)[:2], None, a.window, None)
        rows = attn.pool.k[0].view(attn.pool.num_slots, -1)  # [slots, head_dim]
        return self.block(x, fb, rows, step, self.ops).flatten(1)  # [T, hc * D]

    def logits(self, out: torch.Tensor, target: CausalLM) -> torch.Tensor:
        """Logits [T, V] float32 of a step's outputs `out` [T, hc * D]: its own head's,
        else the target's LM head's."""
        m = self.mtp
        x = m.hc_head.final(out.view(-1, self.arch.hc_mult, self.arch.hidden_size), m.norm)
        head = getattr(m, "head", None)
        if head is None:
            return target.compute_logits(x)  # [T, V]
        return F.linear(x, head.weight).float()  # [T, V]

    def draft_ids(self, out: torch.Tensor, target: CausalLM) -> torch.Tensor:
        """Greedy ids [T] of `out` [T, hc * D]."""
        return self.logits(out, target).argmax(dim=-1)  # [T]
