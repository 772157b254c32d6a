"""Server-sent events: each a JSON payload, a stream's last the `[DONE]` marker (the
OpenAI, `/generate` and SGLang streams all end so)."""

from __future__ import annotations

from typing import Any

import msgspec

DONE = b"data: [DONE]\n\n"
_JSON = msgspec.json.Encoder()  # one encoder for every event of every stream


def sse(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: %b\n\n" % _JSON.encode(payload)
