"""The layout DeepSeek-V4 checkpoints are released in (DeepSeek-V4-Flash, -Pro), read as
the one the model's parameters are named after (the layout transformers writes).

Released names have no `model.` prefix and a few names of their own:

- `embed.weight`, `norm.weight` -> `model.embed_tokens.weight`, `model.norm.weight`
  (`head.weight` is the same in both);
- `hc_head_fn`, `hc_head_base`, `hc_head_scale` -> `model.hc_head.hc_fn`, `.hc_base`,
  `.hc_scale`;
- `layers.N.*` -> `model.layers.N.*`, the attention's KV norm `attn.kv_norm` as `attn.norm`;
- the block scale of an fp8 (or packed fp4) weight, `<module>.scale` (float8_e8m0fnu) ->
  `<module>.weight_scale_inv`;
- `mtp.*`, the multi-token-prediction layer: not the decoder's (None); its draft head
  reads layer 0 of it (`mtp_name`): its decoder block named as the decoder's layer
  `num_hidden_layers` would be, the rest under `mtp.` (`hc_head_fn` as `hc_head.hc_fn`...),
  its copy of the embedding (`emb.*`) not read.

Names in the transformers layout (`model.` prefix) are read unchanged, so either layout
loads.
"""

from __future__ import annotations

TOP_LEVEL = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
UNUSED_PREFIX = "mtp."  # the MTP layer: a draft model's, not the decoder's
MTP_LAYER = "mtp.0."  # the MTP layer a draft head reads
MTP_BLOCK = ("attn.", "ffn.", "attn_norm.", "ffn_norm.", "hc_attn_", "hc_ffn_")
MTP_UNREAD = "emb."  # its copy of the embedding
LAYER_PREFIX = "layers."
RELEASED_SCALE = ".scale"


def _scale_renamed(name: str) -> str:
    """A released block scale `<module>.scale` as `<module>.weight_scale_inv`."""
    if name.endswith(RELEASED_SCALE):
        return name.removesuffix(RELEASED_SCALE) + ".weight_scale_inv"
    return name


def transformers_name(name: str) -> str | None:
    """The transformers-layout name of released checkpoint tensor `name` (a transformers
    name unchanged); None for the MTP layer's tensors."""
    if name.startswith(UNUSED_PREFIX):
        return None
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    if not name.startswith(LAYER_PREFIX):
        return name
    return _scale_renamed("model." + name.replace(".attn.kv_norm.", ".attn.norm."))


def mtp_name(name: str, layer: int) -> str | None:
    """The name MTP layer tensor `name` (`mtp.0.*`) has in the MTP head: its decoder
    block's as the decoder's layer `layer` (`model.layers.{layer}.*`), the rest under
    `mtp.`; None for any other tensor and the layer's embedding copy."""
    if not name.startswith(MTP_LAYER):
        return None
    rest = name.removeprefix(MTP_LAYER)
    if rest.startswith(MTP_BLOCK):
        return transformers_name(f"{LAYER_PREFIX}{layer}.{rest}")
    if rest.startswith(MTP_UNREAD):
        return None
    top = TOP_LEVEL.get(rest, "").removeprefix("model.")
    return UNUSED_PREFIX + (top if top.startswith("hc_head.") else _scale_renamed(rest))
