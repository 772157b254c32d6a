"""Check, before any process starts, that the worker can build the model a config describes.

The model is built on the meta device (no memory, milliseconds), exactly as the worker
builds it, so whatever the model code refuses (a `model_type`, an activation, a RoPE type,
a `--tp` that does not divide the heads) is refused here with the same words, as one line
naming the config file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

from runtime.config.server import ServerConfig
from runtime.model_config import ModelSpec, resolve_model, spec_for
from runtime.model_errors import MODEL_ERRORS
from runtime.worker.kv_pool import check_latent_kv_dtype
from runtime.worker.loader import build_model
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.models.deepseek_v4 import DeepseekV4ForCausalLM
from runtime.worker.models.deepseek_v4_entries import check_v4_kv_dtype
from runtime.worker.safetensors_reader import WeightLoadError
from runtime.worker.shard_loader import ShardLoader
from runtime.worker.speculative.eagle_head import EagleHead
from runtime.worker.speculative.eagle_layout import EagleHeadMismatch, read_layout
from runtime.worker.speculative.mtp_checks import MtpUnavailable
from runtime.worker.speculative.mtp_head import mtp_head_class
from runtime.worker.tp import TPGroup


class UnsupportedModel(ValueError):
    """The model's config asks for something the worker cannot build or load."""


# MODEL_ERRORS, and what building or loading the model raises for a checkpoint that does not fit
LOAD_ERRORS = (*MODEL_ERRORS, UnsupportedModel, WeightLoadError, NotImplementedError,
               torch.OutOfMemoryError, EagleHeadMismatch, MtpUnavailable)


def prepare_model(cfg: ServerConfig) -> ModelSpec:
    """The server's model, resolved before its processes start (a Hub id's files fetched, a
    GGUF converted, once) and checked as `check_model` does, and so is its draft model
    (`check_draft_model`), EAGLE head (`check_eagle_head`) or MTP layer (its head's
    `check`, `mtp_head_class`); raises one of LOAD_ERRORS."""
    spec = spec_for(cfg, offline=False)
    check_model(spec, cfg.quantization, cfg.tp, cfg.kv_dtype)
    if cfg.speculative_algorithm == "draft":
        draft = resolve_model(cfg.speculative_draft_model, offline=False)
        check_model(draft)
        check_draft_model(spec, draft)
    if cfg.speculative_algorithm == "eagle":
        check_eagle_head(spec, cfg.speculative_draft_model)
    if cfg.speculative_algorithm == "mtp":
        mtp_head_class(spec).check(spec, cfg.quantization, TPGroup(0, cfg.tp))
    return spec


def check_eagle_head(target: ModelSpec, folder: str) -> None:
    """Raise `EagleHeadMismatch` (one line, naming the field or tensor) unless the EAGLE
    head in `folder` fits `target`: its layout, sizes and every tensor's shape."""
    EagleHead.check(read_layout(folder, target.hf_config()))


def check_draft_model(target: ModelSpec, draft: ModelSpec) -> None:
    """Raise `UnsupportedModel` (one line) unless `draft` can draft for `target`: its
    token ids must mean the target's, so its vocabulary must have the target's size, and
    its KV must be a pool of token slots (DeepSeek-V4 also keeps state per request row)."""
    if draft.hf_config().model_type in DeepseekV4ForCausalLM.MODEL_TYPES:
        raise UnsupportedModel(f"{draft.config_source}: speculative_draft_model of model_type "
                               f"{draft.hf_config().model_type!r} is not supported")
    target_vocab, draft_vocab = target.hf_config().vocab_size, draft.hf_config().vocab_size
    if draft_vocab != target_vocab:
        raise UnsupportedModel(f"{draft.config_source}: the draft model's vocabulary has "
                               f"{draft_vocab} ids, the target's ({target.config_source}) "
                               f"{target_vocab}")


def check_model(spec: ModelSpec, quantization: str = "none", tp: int = 1,
                kv_dtype: str = "auto") -> None:
    """Raise `UnsupportedModel` ("<path>/config.json: <what is wrong>") if the worker
    could not build `spec`'s model with `--quantization` and `--tp` as given (a shipped
    block fp8 checkpoint: each rank's share of a weight whole scale blocks, as loading
    checks), or (a DeepSeek-V4 or latent-attention model, whose pools store fewer kinds)
    could not store its KV as `--kv-dtype`."""
    source = spec.config_source
    try:
        config = spec.hf_config()
    # transformers: an unknown model_type; a field its config class validates and refuses
    except (OSError, ValueError, KeyError, StrictDataclassError) as exc:
        raise UnsupportedModel(f"{source}: {_config_problem(spec, exc)}") from None
    try:  # the checkpoint's quantization_config is read (and refused) here too
        with torch.device("meta"):
            model = build_model(config, TPGroup(0, tp), quantization)
            if model.quant.shipped and tp > 1:
                ShardLoader(model)  # a shipped fp8 weight's rank share: whole scale blocks
        if isinstance(model, DeepseekV4ForCausalLM):
            check_v4_kv_dtype(kv_dtype)
        check_latent_kv_dtype(isinstance(model, DeepseekForCausalLM), kv_dtype)
    except (NotImplementedError, ValueError) as exc:
        raise UnsupportedModel(f"{source}: {exc}") from None


def _config_problem(spec: ModelSpec, exc: Exception) -> str:
    """What is wrong with a config transformers refuses, in one line."""
    from transformers import CONFIG_MAPPING

    if spec.path is not None:
        kind = json.loads((Path(spec.path) / "config.json").read_text()).get("model_type")
        if kind not in CONFIG_MAPPING:
            return f"model_type {kind!r} is not supported (transformers does not know it)"
    if isinstance(exc, StrictDataclassError) and exc.__cause__ is not None:
        exc = exc.__cause__  # the validator's words, which name the field
    return (str(exc).splitlines() or [type(exc).__name__])[0]
