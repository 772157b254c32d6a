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
- `mtp.*`, the multi-token-prediction layer: not used (None).

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
LAYER_PREFIX = "layers."
RELEASED_SCALE = ".scale"


def transformers_name(name: str) -> str | None:
    """The transformers-layout name of released checkpoint tensor `name` (a transformers
    name unchanged); None for the MTP layer's tensors."""
    if name.startswith(UNUSED_PREFIX):
        return None
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    if not name.startswith(LAYER_PREFIX):
        return name
    name = "model." + name.replace(".attn.kv_norm.", ".attn.norm.")
    if name.endswith(RELEASED_SCALE):
        return name.removesuffix(RELEASED_SCALE) + ".weight_scale_inv"
    return name
