"""`SamplingParams` from the `sampling_params` object of a `/generate` JSON body.

JSON object keys are strings, so a `logit_bias` map arrives keyed by token ids spelled as
strings (`{"42": -100}`); they become the ints `SamplingParams` holds. Any other key is
left as it is, for the conversion to reject by name.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.api.openai.protocol import ApiError
from runtime.wire.sampling import SamplingParams

_MAX_ID_DIGITS = 20  # more digits is no 64-bit id: left as a string, and rejected


def params_from_json(raw: dict[str, Any]) -> SamplingParams:
    """The SamplingParams of `raw` (its names already checked); `ApiError(400)` naming a
    field of the wrong type."""
    bias = raw.get("logit_bias")
    if isinstance(bias, dict):
        raw = {**raw, "logit_bias": {_token_key(k): v for k, v in bias.items()}}
    try:
        return msgspec.convert(raw, SamplingParams)
    except msgspec.ValidationError as e:
        raise ApiError(400, f"invalid sampling_params: {e}", param="sampling_params") from None


def _token_key(key: Any) -> Any:
    """A key spelling a decimal int ("42", "-1") as that int, any other key as is."""
    if (isinstance(key, str) and key.isascii() and len(key) <= _MAX_ID_DIGITS
            and key.removeprefix("-").isdigit()):
        return int(key)
    return key
