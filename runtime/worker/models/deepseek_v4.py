"""DeepSeek-V4 (`DeepseekV4ForCausalLM`): hyper-connected decoder
layers of V4 attention (`deepseek_v4_attention.py`) and a V4 mixture of experts
(`deepseek_v4_moe.py`), its KV state as per-token rows of the pool
(`deepseek_v4_state.py`, which says what a prefix hit reuses), compressed entries in
entry pools by window (`deepseek_v4_entries.py`) and partial blocks per request row
(`deepseek_v4_partial.py`).

The residual is `hc_mult` streams `[T, hc, hidden]`. Before each block a hyper-connection
reads all streams (RMS-normed, flattened) through one linear map (`hc_*_fn`, `_base`,
`_scale`) to three sets of weights: `pre` collapses the streams into the block's input,
`post` spreads the block's output back over them, and `comb` (made doubly stochastic by
Sinkhorn-Knopp iterations) mixes the input streams into the output ones:
`h' = post * block(norm(pre . h)) + comb^T h`. After the last layer `hc_head` collapses the
streams the same way (`pre` only) before the final norm.

Parameter names follow the checkpoints transformers writes (`model.layers.N.attn.wq_a`,
`.ffn.experts.E.w1`, `.hc_attn_fn`, `model.hc_head.hc_fn`, `head.weight`); the released
checkpoints' names are read through `deepseek_v4_checkpoint`, their MTP layer skipped (a
draft head of its own, `speculative.mtp_v4_head`, which reads the streams before `hc_head`:
`forward_features`).
Weights in 16 bits or fp32, or block fp8 as released (e8m0 scales; the projections stay
fp8, the routed experts, fp8 or packed fp4, are dequantized at load). The attention and
experts run through the ops (Triton kernels on CUDA, their torch references elsewhere),
the compressors and the indexer over the whole step at once. Under `--tp N` each rank
holds 1/N of the query heads and output groups and of every expert's width; the K=V head
and its pool rows, the compressors, the indexer, the routers and the hyper-connections
whole (`deepseek_v4_tp`).
A decode step reads nothing on the host but what a CUDA graph fixes at capture
(`V4Step.of`), so decode runs in graphs (`GraphRunner`), whose padding rows name the sink
request row and slot; their visible-entry lists are as wide as the graphs' context, which
`deepseek_v4_state.graph_context` caps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.models.causal_lm import CausalLM, Piece, RMSNorm
from runtime.worker.models.deepseek_rope import rope_inv_freq
from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
from runtime.worker.models.deepseek_v4_attention import V4Attention
from runtime.worker.models.deepseek_v4_checkpoint import transformers_name
from runtime.worker.models.deepseek_v4_entries import EntryStore
from runtime.worker.models.deepseek_v4_moe import CHECKPOINT_EXPERT_NAMES, V4MoE
from runtime.worker.models.deepseek_v4_partial import RowStarts, prefix_rule
from runtime.worker.models.deepseek_v4_state import V4Step
from runtime.worker.models.deepseek_v4_tp import split_dim
from runtime.worker.models.sparse_moe import expert_pieces
from runtime.worker.ops import TorchOps, ops_for
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.tp import TPGroup


def hc_input(h: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    """The hyper-connection's linear read of streams `h` `[T, hc, D]`: `[T, rows of fn]`."""
    flat = h.flatten(1).float()  # [T, hc * D]
    return F.linear(F.rms_norm(flat, (flat.shape[-1],), eps=eps), fn.float())


def hc_weights(h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
               arch: DeepseekV4Arch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre `[T, hc]`, post `[T, hc]`, comb `[T, hc, hc]`) fp32 for streams `h`."""
    n, eps = arch.hc_mult, arch.hc_eps
    mixes = hc_input(h, fn, arch.rms_norm_eps)  # [T, (2 + hc) * hc]
    pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.float().split([n, n, n * n])
    s_pre, s_post, s_comb = scale.float().unbind(0)
    pre = torch.sigmoid(pre_w * s_pre + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * s_post + post_b)
    comb = torch.softmax(comb_w.view(-1, n, n) * s_comb + comb_b.view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(arch.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def collapse(h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Streams `[T, hc, D]` weighted by `pre` `[T, hc]` and summed: `[T, D]` in h's dtype."""
    return (pre[..., None] * h).sum(dim=1).to(h.dtype)


def normed(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """`x` `[..., D]` RMS-normed by `norm` over its last dim (in fp32), in x's dtype."""
    return F.rms_norm(x.float(), (x.shape[-1],), norm.weight.float(), norm.eps).to(x.dtype)


class HyperHead(nn.Module):
    """The final collapse of the streams (`model.hc_head.hc_fn`, `hc_base`, `hc_scale`)."""

    def __init__(self, arch: DeepseekV4Arch) -> None:
        super().__init__()
        self.arch = arch
        self.hc_fn = nn.Parameter(torch.empty(arch.hc_mult, arch.hc_mult * arch.hidden_size))
        self.hc_base = nn.Parameter(torch.empty(arch.hc_mult))
        self.hc_scale = nn.Parameter(torch.empty(1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mixes = hc_input(h, self.hc_fn, self.arch.rms_norm_eps)  # [T, hc]
        pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float())
        return collapse(h, pre + self.arch.hc_eps)  # [T, D]

    def final(self, h: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """Streams `h` `[T, hc, D]` collapsed, then normed by `norm`: `[T, D]`, what an LM
        head reads."""
        return normed(self(h), norm)


def hc_params_to_fp32(module: nn.Module) -> None:
    """The hyper-connection parameters (`hc_*`) of `module` in fp32: the mixing runs in
    fp32, converted once here, not at every block of every step."""
    for name, param in module.named_parameters():
        if name.rsplit(".", 1)[-1].startswith("hc_"):
            param.data = param.data.float()


def init_layers(layers: list[nn.Module], arch: DeepseekV4Arch, device: torch.device) -> None:
    """Once the weights are in: each layer's RoPE frequencies (sliding window: the main
    ones; compressed: the compressed branches'), the hash routers' tables kept within the
    experts."""
    main, compress = ((freq.to(device), attention) for freq, attention in (
        rope_inv_freq(arch.rope_dim, arch.rope_main),
        rope_inv_freq(arch.rope_dim, arch.rope_compress)))
    for layer in layers:
        layer.attn.freqs = main if layer.attn.compressor is None else compress
        table = getattr(layer.ffn.gate, "tid2eid", None)
        if table is not None:
            table.remainder_(arch.n_routed_experts)


class V4DecoderLayer(nn.Module):
    """Hyper-connected attention then mixture of experts (this rank's share under `tp`)."""

    def __init__(self, arch: DeepseekV4Arch, layer_id: int, quant: QuantScheme,
                 tp: TPGroup) -> None:
        super().__init__()
        self.arch, self.layer_id = arch, layer_id
        a, n = arch, arch.hc_mult
        self.attn_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.attn = V4Attention(a, layer_id, quant, tp)
        self.ffn_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.ffn = V4MoE(a, layer_id, quant, tp)
        mixes = (2 + n) * n  # pre, post: n each; comb: n x n
        for block in ("attn", "ffn"):
            setattr(self, f"hc_{block}_fn", nn.Parameter(torch.empty(mixes, n * a.hidden_size)))
            setattr(self, f"hc_{block}_base", nn.Parameter(torch.empty(mixes)))
            setattr(self, f"hc_{block}_scale", nn.Parameter(torch.empty(3)))

    def _block(self, h: torch.Tensor, name: str, norm: RMSNorm, run) -> torch.Tensor:
        pre, post, comb = hc_weights(h, getattr(self, f"hc_{name}_fn"),
                                     getattr(self, f"hc_{name}_base"),
                                     getattr(self, f"hc_{name}_scale"), self.arch)
        out = run(normed(collapse(h, pre), norm))  # [T, D]
        dtype = h.dtype
        return post.to(dtype)[..., None] * out[:, None, :] + torch.matmul(
            comb.to(dtype).transpose(-1, -2), h)  # [T, hc, D]

    def forward(self, h: torch.Tensor, fb: ForwardBatch, rows: torch.Tensor, step: V4Step,
                ops: TorchOps, rows_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Streams `h` `[T, hc, D]` through attention over the layer's pool `rows` (with
        `rows_scale` in an fp8 pool: `V4Attention.forward`) and the experts."""
        h = self._block(h, "attn", self.attn_norm,
                        lambda x: self.attn(x, step, rows, ops, rows_scale))
        return self._block(h, "ffn", self.ffn_norm, lambda x: self.ffn(x, fb.input_ids, ops))


class DeepseekV4ForCausalLM(CausalLM):
    """DeepseekV4ForCausalLM checkpoints. The KV pool it needs: one `head_dim` row a token
    and layer (`kv_layout`); beside it, the entry pools (`allocate_entries`, ids written
    by `write_entries` where the scheduler hands them out), the partial blocks and entry
    tables of each request row (`allocate_rows`), and the rule its prefix hits follow
    (`prefix_rule`)."""

    MODEL_TYPES = ("deepseek_v4",)
    ARCH = DeepseekV4Arch
    WEIGHT_FORMATS = ("none", "fp8_block")

    def __init__(self, arch: DeepseekV4Arch, tp: TPGroup | None = None,
                 quantization="none") -> None:
        super().__init__(arch, tp, quantization)
        self.model.hc_head = HyperHead(arch)
        self.starts: RowStarts | None = None  # set by `allocate_rows`
        self.entries: EntryStore | None = None  # set by `allocate_rows`, its pools later

    def kv_layout(self) -> tuple[int, int, tuple[int, ...]]:
        """(planes, kv heads, each layer's head dim) of the pool: one K=V row a token and
        layer."""
        return 1, 1, (self.arch.head_dim,) * self.arch.num_layers

    def allocate_entries(self, num_slots: int, page_size: int,
                         kv_dtype: str = "auto") -> EntryStore:
        """The entry pools beside a pool of `num_slots` slots, stored as `kv_dtype` says
        (`EntryStore.allocate`)."""
        self.entries.allocate(num_slots, page_size, kv_dtype)
        return self.entries

    def write_entries(self, writes: list[tuple[int, int, int, list[int]]]) -> None:
        """The window ids a step's plan hands out (`BatchPlan.entry_writes`)."""
        self.entries.write(writes)

    def prefix_rule(self) -> tuple[int, int]:
        """(align, replay) of prefix hits (`deepseek_v4_partial.prefix_rule`)."""
        return prefix_rule(self.arch)

    def allocate_rows(self, rows: int, dtype: torch.dtype, max_context: int = 0,
                      entry_table: bool = False, drafts: int = 0) -> int:
        """The partial blocks of `rows` request rows, for verify steps of up to `drafts`
        drafts (`deepseek_v4_partial.ring_length`), and, with `entry_table` (entry ids
        handed out by the scheduler), their entry tables over `max_context` positions, on
        the model's device: their bytes."""
        device = next(self.parameters()).device
        compressors = [c for layer in self.model.layers for c in layer.attn.compressors()]
        for c in compressors:
            c.allocate(rows, dtype, device, drafts)
        self.starts = RowStarts(rows, self.prefix_rule()[1], device)
        self.entries = EntryStore(self.arch, rows, max_context, entry_table, dtype, device)
        return sum(c.ring.nbytes for c in compressors) + self.entries.table_bytes

    def bind_rows(self, rows: list[int]) -> None:
        """Rows `rows` serve new requests: their partial blocks are forgotten."""
        self.starts.bind(rows)

    def decoder_layer(self, layer_id: int) -> nn.Module:
        return V4DecoderLayer(self.arch, layer_id, self.quant, self.tp)

    def tp_split_dim(self, hf_name: str) -> int | None:
        """How V4's checkpoint tensors are cut over the ranks (`deepseek_v4_tp.split_dim`)."""
        return split_dim(hf_name)

    def streams(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """The new tokens' streams after the last layer, before `hc_head`: `[T, hc, D]`."""
        m = self.model
        step = V4Step.of(fb, attn.page_table(fb)[:2], self.starts, self.arch.window,
                         self.entries)
        x = m.embed_tokens(fb.input_ids)  # [T, D]
        h = x[:, None, :].expand(-1, self.arch.hc_mult, -1).contiguous()  # [T, hc, D]
        pool = attn.pool
        for i, layer in enumerate(m.layers):
            rows = pool.k[i].view(pool.num_slots, -1)  # [slots, head_dim]
            scale = pool.k_scale[i].view(-1) if pool.scaled else None  # [slots]
            h = layer(h, fb, rows, step, m.ops, scale)
        return h

    def forward(self, fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        return self.model.hc_head.final(self.streams(fb, attn), self.model.norm)  # [T, D]

    def forward_features(self, fb: ForwardBatch, attn: AttentionBackend,
                         capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-normed hidden states [T, D], the streams before `hc_head`, flattened
        [T, hc * D]: what the MTP layer reads). No layer's streams are offered (`capture`
        must be empty)."""
        if capture:
            raise ValueError(f"deepseek_v4 offers a draft head its final streams, not the "
                             f"residual after layers {capture}")
        h = self.streams(fb, attn)  # [T, hc, D]
        return self.model.hc_head.final(h, self.model.norm), h.flatten(1)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Once the weights are in: the ops (its layers rotate by themselves), the layers'
        own (`init_layers`), and the hyper-connection parameters in fp32."""
        hc_params_to_fp32(self)
        device = next(self.parameters()).device
        self.model.ops = ops_for(device)
        init_layers(self.model.layers, self.arch, device)

    def checkpoint_name(self, name: str) -> str | None:
        """Released checkpoints' names in the transformers layout; None for the MTP layer."""
        return transformers_name(name)

    def checkpoint_pieces(self, module: str, leaf: str, param: torch.Tensor) -> list[Piece]:
        """Stacked experts from `experts.E.w1/w3/w2`; the router's selection bias is
        `gate.bias`; the LM head is `head`."""
        if module == "experts":
            return expert_pieces(leaf, param, self.arch.n_routed_experts,
                                 CHECKPOINT_EXPERT_NAMES)
        if module == "gate" and leaf == "e_score_correction_bias":
            return [("gate.bias", 0, param.shape[0])]
        if module == "lm_head":
            return [(f"head.{leaf}", 0, param.shape[0])]
        return [(f"{module}.{leaf}", 0, param.shape[0])]
