"""The tool-call parts of OpenAI's chat schema: calls in assistant messages (requests and
responses) and call pieces in streamed deltas."""

from __future__ import annotations

import msgspec


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # a JSON object, as text


class ToolCallItem(msgspec.Struct, kw_only=True):
    """A call an assistant message made (sent back in a conversation, or answered)."""

    id: str
    function: FunctionCall
    type: str = "function"


class DeltaFunction(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed piece of call `index`: the first has its id, type and name."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction | None = None
