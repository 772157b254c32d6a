"""What every MTP head (`--speculative-algorithm mtp`) checks of the target's checkpoint
before it loads: a model_type whose MTP layer is implemented (`MTP_TYPES`), a config
that declares the layer, weights that hold every tensor of it; `MtpUnavailable`, naming
the file and the field or tensor, when one is not so."""

from __future__ import annotations

from pathlib import Path

from runtime.model_config import ModelSpec
from runtime.worker.safetensors_reader import checkpoint_files, tensor_spans

# the model_types whose MTP layer is implemented: `MtpHead`, `V4MtpHead`
MTP_TYPES = ("deepseek_v3", "deepseek_v4")


class MtpUnavailable(ValueError):
    """`speculative_algorithm` mtp for a model without a usable MTP layer; the message
    names the file and the field or tensor."""


def mtp_checkpoint(spec: ModelSpec) -> tuple[object, Path, set[str]]:
    """(the transformers config, the checkpoint folder, the names of its tensors) of a
    target `spec` whose config declares an MTP layer of an implemented model_type; else
    `MtpUnavailable` naming the field."""
    config, source = spec.hf_config(), spec.config_source
    kind = getattr(config, "model_type", "")
    if kind not in MTP_TYPES:
        raise MtpUnavailable(f"{source}: speculative_algorithm mtp runs the MTP layer of "
                             f"model_type {MTP_TYPES}, not {kind!r}")
    layers = getattr(config, "num_nextn_predict_layers", 0) or 0
    if layers < 1 or spec.path is None:
        what = f"num_nextn_predict_layers is {layers}" if layers < 1 else "no weights"
        raise MtpUnavailable(f"{source}: {what}: the model has no MTP layer for "
                             "speculative_algorithm mtp")
    folder = Path(spec.path)
    return config, folder, {n for path in checkpoint_files(folder) for n in tensor_spans(path)}


def check_complete(wanted: set[str], present: set[str], folder: Path, where: str) -> None:
    """`MtpUnavailable` naming the first of the MTP layer's tensors `wanted` not `present`
    in the checkpoint (`where`: how the checkpoint names the layer)."""
    missing = sorted(wanted - present)
    if missing:
        raise MtpUnavailable(f"{folder}: tensor {missing[0]} of the MTP layer ({where}) is "
                             "missing (speculative_algorithm mtp)")
