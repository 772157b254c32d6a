"""`EagleLayout`: what a released EAGLE draft head's folder holds, read from its
config.json and checked against the target's config before any weight is loaded.

Two layouts over a Llama-family target of hidden size h:

- EAGLE (v1/v2): a Llama config of one hidden layer; `fc` [h, 2h] (optionally with a
  bias) over concat(embedding of token t + 1, the target's final-normed hidden state at
  t), then one Llama decoder layer `layers.0.*` whose `input_layernorm` may be absent (no
  norm before attention then), no final norm; the target's LM head gives its logits.
- EAGLE-3 (architectures `LlamaForCausalLMEagle3`): `fc` [h, 3h] over three of the
  target's residual streams (low, mid, high: the outputs of the layers
  `eagle_config.eagle_aux_hidden_state_layer_ids`, by default those entering layers
  2, L // 2 and L - 3 of the target's L), a decoder layer `midlayer.*` whose attention
  reads concat(input_layernorm(embedding), hidden_norm(hidden)) (2h wide), a final
  `norm`, its own `lm_head` [draft_vocab, h] and, when draft_vocab < vocab, `d2t` (a
  draft id's offset to its target id).

Both take the token embedding from the target (an `embed_tokens.weight` in the folder is
not read). The weights are safetensors files or, in a folder without any, PyTorch `.bin`
files (`pytorch_model.bin`, or shards with `pytorch_model.bin.index.json`) holding a plain
state dict of tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from runtime.worker.kv_pool import kv_bytes_per_token
from runtime.worker.models.llama import SUPPORTED_TYPES, LlamaArch
from runtime.worker.safetensors_reader import WeightLoadError
from runtime.worker.torch_bin_reader import folder_slices

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3",)


class EagleHeadMismatch(ValueError):
    """An EAGLE head that does not fit its target, or a folder that holds none; the
    message names the file and the field or tensor."""


@dataclass(frozen=True)
class EagleLayout:
    """A head's layout (see the module docstring), checked against its target."""

    folder: Path
    eagle3: bool
    arch: LlamaArch  # the head's decoder layer, read as a one-layer Llama config
    # the target's residual streams the head reads, as layer counts (`Decoder.run`);
    # empty: the target's final-normed hidden states (EAGLE v1/v2)
    capture: tuple[int, ...]
    fc_bias: bool
    input_norm: bool  # EAGLE v1/v2: whether its layer normalizes before attention
    draft_vocab: int  # EAGLE-3: rows of its own LM head
    target_vocab: int
    max_position: int  # the longer of the head's and the target's position range

    @property
    def prefix(self) -> str:
        """The checkpoint name prefix of the head's decoder layer."""
        return "midlayer." if self.eagle3 else "layers.0."

    @property
    def source(self) -> str:
        return str(self.folder / "config.json")

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Memory a KV slot costs with this head: its one layer's K/V and the slot's row
        of the feature buffer (`HeadDrafter`), one hidden state."""
        a = self.arch
        return (kv_bytes_per_token(1, a.num_kv_heads, a.head_dim, dtype)
                + a.hidden_size * dtype.itemsize)


def read_layout(folder: str | Path, target) -> EagleLayout:
    """The layout of the EAGLE head in `folder` for the target of transformers config
    `target`; raises `EagleHeadMismatch` naming the field that does not fit."""
    folder = Path(folder)
    source = folder / "config.json"
    if not source.is_file():
        raise EagleHeadMismatch(f"{folder}: no config.json (speculative_draft_model names "
                                "the folder of an EAGLE head)")
    cfg = json.loads(source.read_text())
    kind = getattr(target, "model_type", "")
    if kind not in SUPPORTED_TYPES:
        raise EagleHeadMismatch(f"{source}: EAGLE heads draft for Llama-family targets "
                                f"{SUPPORTED_TYPES}, not model_type {kind!r}")
    try:
        arch = LlamaArch.from_hf(SimpleNamespace(**{"model_type": "llama", **cfg}))
    except (AttributeError, NotImplementedError, TypeError) as exc:
        raise EagleHeadMismatch(f"{source}: {exc}") from None
    eagle3 = bool(set(cfg.get("architectures") or ()) & set(EAGLE3_ARCHITECTURES))
    h = target.hidden_size
    for name, want in (("hidden_size", h), ("target_hidden_size", h),
                       ("vocab_size", target.vocab_size), ("num_hidden_layers", 1)):
        got = cfg.get(name, want)
        if got != want:
            raise EagleHeadMismatch(f"{source}: {name} is {got}, an EAGLE head for this "
                                    f"target needs {want}")
    if eagle3 and arch.tie_word_embeddings:
        raise EagleHeadMismatch(f"{source}: tie_word_embeddings: an EAGLE-3 head with a "
                                "tied LM head is not supported")
    shapes = tensor_shapes(folder)
    fc = shapes.get("fc.weight")
    want_fc = (h, (3 if eagle3 else 2) * h)
    if fc != want_fc:
        raise EagleHeadMismatch(f"{folder}: fc.weight has shape {fc}, an "
                                f"EAGLE{'-3' if eagle3 else ''} head over hidden size {h} "
                                f"needs {want_fc}")
    return EagleLayout(
        folder=folder, eagle3=eagle3, arch=arch,
        capture=_capture(cfg, target.num_hidden_layers, source) if eagle3 else (),
        fc_bias="fc.bias" in shapes,
        input_norm=eagle3 or "layers.0.input_layernorm.weight" in shapes,
        draft_vocab=cfg.get("draft_vocab_size") or target.vocab_size,
        target_vocab=target.vocab_size,
        max_position=max(arch.max_position, getattr(target, "max_position_embeddings", 0)))


def _capture(cfg: dict, layers: int, source: Path) -> tuple[int, ...]:
    """The target streams an EAGLE-3 head reads, as layer counts (`Decoder.run`): the
    outputs of layers `eagle_config.eagle_aux_hidden_state_layer_ids` (by default 1,
    layers // 2 - 1 and layers - 4), each of which feeds a later layer."""
    field = "eagle_config.eagle_aux_hidden_state_layer_ids"
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    given = ids is not None
    ids = list(ids) if given else [1, layers // 2 - 1, layers - 4]
    if len(ids) != 3 or not all(isinstance(i, int) and 0 <= i <= layers - 2 for i in ids):
        what = f"{field} {ids}" if given else f"the default {field} {ids}"
        raise EagleHeadMismatch(f"{source}: {what} must be 3 layer ids in 0..{layers - 2} "
                                f"(the target has {layers} layers)")
    return tuple(i + 1 for i in ids)


def tensor_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of the folder's weight files (safetensors, else `.bin`: `folder_slices`)
    by name: its shape (headers, or the pickled metadata: no tensor data is read)."""
    try:
        return {name: tuple(sl.get_shape()) for name, sl in folder_slices(folder, lambda _: True)}
    except WeightLoadError as exc:
        raise EagleHeadMismatch(str(exc)) from None
