"""OpenAI's `response_format` as a JSON schema for `SamplingParams.json_schema`.

`{"type": "text"}` (or none) leaves the output free; `{"type": "json_object"}` asks for
any JSON object; `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
"strict": ...}}` for JSON valid under `schema`. The schema itself is checked later, with
the request's other constraints (`runtime.grammar.check_grammar`), before it is queued.
"""

from __future__ import annotations

import json
from typing import Any

from runtime.wire.errors import InvalidRequest

ANY_OBJECT = '{"type": "object"}'


def response_json_schema(fmt: Any) -> str | None:
    """The JSON schema (as text) that `fmt` asks the output to follow, or None; raises
    `InvalidRequest` for a format it cannot be."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise InvalidRequest("response_format.type must be 'text', 'json_object' or "
                             f"'json_schema', got {kind!r}")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON schema "
                             "object")
    return json.dumps(schema)
