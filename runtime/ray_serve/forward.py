"""What the ingress hands a server replica, and what comes back first.

The ingress reads the whole HTTP request and sends it as a `ForwardRequest`; the replica
answers with a stream whose first item is the `ReplyHead` (status and headers of its
server's answer), then the body's bytes as the server sends them (SSE events as they come).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# hop-by-hop headers and those the next hop sets itself
_NOT_FORWARDED = {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                  "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection",
                  "date", "server"}


@dataclass(frozen=True)
class ForwardRequest:
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    prefix_key: str
    """The prompt as text, for prefix-aware routing (empty: none)."""


@dataclass(frozen=True)
class ReplyHead:
    status: int
    headers: tuple[tuple[str, str], ...]
    replica: str
    """The Serve replica that answered (its full id)."""

    @property
    def is_stream(self) -> bool:
        return any(k == "content-type" and v.startswith("text/event-stream")
                   for k, v in self.headers)


def forwarded_headers(headers) -> tuple[tuple[str, str], ...]:
    """`headers` (name, value pairs) less the hop-by-hop ones, names in lower case."""
    return tuple((k.lower(), v) for k, v in headers if k.lower() not in _NOT_FORWARDED)


def prefix_key(body: bytes) -> str:
    """The prompt of a JSON request body as compact text: OpenAI `messages` or `prompt`,
    SGLang `text` or `input_ids`; empty for anything else."""
    try:
        obj = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(obj, dict):
        return ""
    for name in ("messages", "prompt", "text", "input_ids"):
        if obj.get(name) is not None:
            value = obj[name]
            return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return ""
