"""What a client learns about the served model (over HTTP and RPC)."""

from __future__ import annotations

import msgspec


class RoleMarkers(msgspec.Struct, kw_only=True):
    """Text around one chat message of a role, as the model's chat template renders it.

    A conversation renders as, per message, (`first_prefix` for the first message, else
    `prefix`) + content + `suffix`; the assistant's `prefix` is the generation prompt.
    `first_prefix` holds what the template puts before a conversation that starts with
    this role (a BOS token, a default system message).
    """

    first_prefix: str
    prefix: str
    suffix: str


class ModelInfo(msgspec.Struct, kw_only=True):
    """What a client needs to know about the served model."""

    model: str
    max_model_len: int
    chat_roles: dict[str, RoleMarkers] = {}  # "system" | "user" | "assistant"; {}: no template
    quantization: str = "none"  # the projections' weights: none or fp8
    kv_dtype: str = ""  # the KV storage: fp8, int8, or the model's dtype (bfloat16, ...)
    # what requests get for the sampling fields they leave unset (generation_config.json)
    default_sampling_params: dict[str, int | float] = {}
