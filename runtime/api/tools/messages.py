"""The tool parts of chat messages, as chat templates take them: an assistant's
`tool_calls` and a tool answer's `tool_call_id`.

Most templates write a call's arguments with `| tojson`, so they get the arguments as an
object; some join them to text with `+`, which fails on an object: those get the text the
client sent (see `chat.chat_prompt_text`)."""

from __future__ import annotations

import json
from typing import Any

from runtime.api.openai.protocol import ApiError, ChatMessage


def tool_fields(msg: ChatMessage, index: int, text_arguments: bool = False) -> dict[str, Any]:
    """The template fields of message `index`'s tool parts ({} without any); the calls'
    arguments as objects, or with `text_arguments` as the JSON text sent."""
    fields: dict[str, Any] = {}
    if msg.tool_call_id is not None:
        fields["tool_call_id"] = msg.tool_call_id
    if not msg.tool_calls:
        return fields
    if msg.role != "assistant":
        raise ApiError(400, f"messages[{index}].tool_calls: only assistant messages make "
                            "tool calls", param=f"messages[{index}].tool_calls")
    calls = []
    for j, call in enumerate(msg.tool_calls):
        where = f"messages[{index}].tool_calls[{j}]"
        if call.type != "function":
            raise ApiError(400, f"{where}.type must be 'function'", param=f"{where}.type")
        try:
            args = json.loads(call.function.arguments)
        except (ValueError, RecursionError):
            args = None
        if not isinstance(args, dict):
            raise ApiError(400, f"{where}.function.arguments must be a JSON object (as "
                                "text)", param=f"{where}.function.arguments")
        arguments = call.function.arguments if text_arguments else args
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": arguments}})
    fields["tool_calls"] = calls
    if msg.content is None:
        fields["content"] = None  # no content, as the renderer shows it: the key left out
    return fields


def tools_chars(msg: ChatMessage) -> int:
    """The text a message's tool calls add to the conversation."""
    return sum(len(c.function.name) + len(c.function.arguments) for c in msg.tool_calls or ())
