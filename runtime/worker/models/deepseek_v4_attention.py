"""DeepSeek-V4 attention of one layer: a query LoRA, one shared K=V head, attention over
the sliding window plus (CSA / HCA layers) the compressed entries, a learned sink per head,
and the grouped output projection.

Per query at position t the keys are the K=V rows of positions (t - window, t] and the
entries closed by t (HCA: all of them; CSA: the indexer's picks among them), in one softmax
whose denominator also holds the head's sink `exp(attn_sink)`. Values are the same rows,
so they carry the keys' rotation: the output's rope values are rotated back at t. All the
step's queries attend in one `ops.sparse.mqa` over two key lists (`V4Step`): each one's
window (slots of the pool's rows), and its entries (ids in the layer's entry pool: every
visible one, or the indexer's picks). The
output heads form `o_groups` groups, each projected to `o_lora_rank` (`wo_a`, block
diagonal), then mixed to the hidden size (`wo_b`).

The query, KV and output projections (and the indexer's query) are stored as the model's
`QuantScheme` says: block fp8 in the released checkpoints. A block fp8 `wo_a` runs group by
group, each group's rows whole scale blocks; where `o_lora_rank` is not a multiple of the
block rows it is kept in 16 bits (dequantized at load).

Under tensor parallelism a rank holds its share of the query heads with their sinks and
output groups; the K=V head, the compressors and the indexer are whole on every rank
(`deepseek_v4_tp`).

An fp8 pool (`--kv-dtype fp8`) holds the K=V rows and the entries as e4m3 codes with one
float32 scale a row: quantized as they are written (`kernels.kv.store.store_rows`), read
through their scales by the sparse attention, the step's own new rows included (decode and
extend read the same stored rows, so a prefix hit reads what its owner read).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.kv.store import store_rows
from runtime.worker.models.causal_lm import RMSNorm
from runtime.worker.models.deepseek_v4_arch import CSA, SWA, DeepseekV4Arch
from runtime.worker.models.deepseek_v4_compressor import Compressor, Indexer
from runtime.worker.models.deepseek_v4_rope import apply_rope
from runtime.worker.models.deepseek_v4_state import V4Step
from runtime.worker.models.deepseek_v4_windows import closing_of
from runtime.worker.models.parallel import column_linear, row_linear
from runtime.worker.ops import TorchOps
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear, block_fp8_linear
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup


class V4Attention(nn.Module):
    """One layer's attention: under `tp` this rank's heads and output groups (H and g in
    the shape comments), `wo_b`'s partial sums all-reduced (`deepseek_v4_tp`). Parameter
    names follow the checkpoint (`attn.*`)."""

    def __init__(self, arch: DeepseekV4Arch, layer_id: int, quant: QuantScheme,
                 tp: TPGroup) -> None:
        super().__init__()
        a, self.layer_id = arch, layer_id
        hf = f"model.layers.{layer_id}.attn"

        def linear(name: str, in_features: int, out_features: int) -> nn.Module:
            return column_linear(in_features, out_features, False, quant, [f"{hf}.{name}"])

        self.kind, self.rate = a.layer_types[layer_id], a.rate(layer_id)
        self.heads = tp.shard(a.num_heads, "num_attention_heads")  # this rank's
        self.groups = tp.shard(a.o_groups, "o_groups")  # this rank's: whole heads each
        self.head_dim, self.window = a.head_dim, a.window
        self.eps = a.rms_norm_eps
        self.wq_a = linear("wq_a", a.hidden_size, a.q_lora_rank)
        self.q_norm = RMSNorm(a.q_lora_rank, a.rms_norm_eps)
        self.wq_b = linear("wq_b", a.q_lora_rank, self.heads * a.head_dim)
        self.wkv = linear("wkv", a.hidden_size, a.head_dim)
        self.norm = RMSNorm(a.head_dim, a.rms_norm_eps)
        group_in = a.num_heads * a.head_dim // a.o_groups
        self.o_rank = a.o_lora_rank
        whole_blocks = quant.block is None or a.o_lora_rank % quant.block[0] == 0
        mixed = self.groups * a.o_lora_rank
        self.wo_a = (linear("wo_a", group_in, mixed) if whole_blocks
                     else nn.Linear(group_in, mixed, bias=False))
        self.wo_b = row_linear(mixed, a.hidden_size, False, tp, quant, [f"{hf}.wo_b"])
        self.attn_sink = nn.Parameter(torch.empty(self.heads))
        self.compressor = self.indexer = None
        if self.kind != SWA:
            self.compressor = Compressor(a.hidden_size, a.head_dim, self.rate, self.kind == CSA,
                                         a.rms_norm_eps)
        if self.kind == CSA:
            self.indexer = Indexer(a.hidden_size, a.index_n_heads, a.index_head_dim, self.rate,
                                   a.index_topk, a.rms_norm_eps,
                                   linear("indexer.wq_b", a.q_lora_rank,
                                          a.index_n_heads * a.index_head_dim))
        self.freqs: tuple[torch.Tensor, float] | None = None  # set by the model's init_buffers

    def compressors(self) -> list[Compressor]:
        """The layer's compressors: none (sliding window), its own (HCA), its own and the
        indexer's (CSA)."""
        own = [] if self.compressor is None else [self.compressor]
        return own + ([] if self.indexer is None else [self.indexer.compressor])

    def forward(self, x: torch.Tensor, step: V4Step, rows: torch.Tensor, ops: TorchOps,
                rows_scale: torch.Tensor | None = None) -> torch.Tensor:
        """`x` `[T, hidden]` (normed) of the step's new tokens, stored at `step.out_slots` of
        this layer's pool `rows` `[slots, head_dim]` (e4m3 codes with `rows_scale` `[slots]`
        float32 in an fp8 pool; entries: at their ids in the layer's entry pools,
        `step.entries`): `[T, hidden]`."""
        freqs, tokens, positions = self.freqs, x.shape[0], step.positions
        q_lora = self.wq_a(x)
        q_lora = F.rms_norm(q_lora.float(), (q_lora.shape[-1],), self.q_norm.weight.float(),
                            self.eps).to(x.dtype)  # [T, rank]
        q = self.wq_b(q_lora).view(tokens, self.heads, self.head_dim)  # [T, H, d]
        q = F.rms_norm(q.float(), (self.head_dim,), eps=self.eps).to(x.dtype)
        q = apply_rope(q, positions, freqs)
        kv = self.wkv(x)
        kv = F.rms_norm(kv.float(), (self.head_dim,), self.norm.weight.float(), self.eps)
        kv = apply_rope(kv.to(x.dtype), positions, freqs)  # [T, d]
        store_rows(kv, rows, step.out_slots, rows_scale)
        entries = {}
        if self.compressor is not None:
            self.close_windows(x, step, ops)
            if self.indexer is None:  # HCA: every entry closed by the token
                listed = step.visible_ids(self.rate)  # [T, n]
            else:  # CSA: the indexer's picks
                keys = step.entries.idx_key[self.layer_id]  # [ids, index_head_dim]
                picks = self.indexer.pick(x, q_lora, step, keys, freqs, ops)
                listed = step.entry_ids(picks, self.rate)  # [T, topk]
            entries = dict(entry_kv=step.entries.entry[self.layer_id], entry_indices=listed,
                           entry_scale=step.entries.scale(self.layer_id))
        out = ops.sparse.mqa(q, rows, step.window, self.attn_sink, self.head_dim**-0.5,
                             kv_scale=rows_scale, **entries)  # [T, H, d]
        out = apply_rope(out, positions, freqs, inverse=True)  # [T, H, d]
        mixed = self.grouped_output(out.view(tokens, self.groups, -1))  # [T, g, r]
        return self.wo_b(mixed.reshape(tokens, -1))  # [T, hidden]

    def close_windows(self, x: torch.Tensor, step: V4Step, ops: TorchOps) -> None:
        """Each compressor's entries of the windows the step's new tokens (`x` `[T, hidden]`)
        close, every sequence at once (`closing_of`), into the layer's entry pools (entries,
        with their scales in an fp8 pool, and indexer keys), before any token reads them."""
        entries, i = step.entries, self.layer_id
        pools = ((entries.entry[i], entries.scale(i)), (entries.idx_key.get(i), None))
        for c, (pool, scale) in zip(self.compressors(), pools):
            kv, gate = c.project(x)  # [T, width] each
            closing = closing_of(step, c.rate, c.overlap, c.ring)
            c.close_windows(kv, gate, closing, pool, self.freqs, ops, scale)

    def grouped_output(self, grouped: torch.Tensor) -> torch.Tensor:
        """Each head group `[T, g, H * d / g]` through its own rows of `wo_a`: `[T, g, r]`."""
        w, r = self.wo_a, self.o_rank
        if isinstance(w, BlockFp8Linear):
            rows = r // w.block[0]  # scale rows of one group
            return torch.stack([
                block_fp8_linear(grouped[:, i], w.weight[i * r : (i + 1) * r],
                                 w.weight_scale_inv[i * rows : (i + 1) * rows], w.block)
                for i in range(self.groups)], dim=1)  # fmt: skip
        w_a = w.weight.view(self.groups, r, -1)  # [g, r, H * d / g]
        return torch.bmm(grouped.transpose(0, 1), w_a.transpose(1, 2)).transpose(0, 1)
