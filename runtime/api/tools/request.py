"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked.

Each tool is `{"type": "function", "function": {"name", "description"?, "parameters"?}}`
with a name of at most 64 letters, digits, `_`, `-` or `.`, and parameters a JSON schema
of an object. At most `MAX_TOOLS` tools, and `MAX_SCHEMA_CHARS` of parameter schemas in
all: a prompt that large would not fit a context, and its grammar would take long to
compile. `tool_choice` is `auto` (the default with tools), `none`, `required` or
`{"type": "function", "function": {"name": ...}}` naming one of the tools.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from runtime.api.openai.protocol import ApiError

MAX_TOOLS = 128
MAX_SCHEMA_CHARS = 1 << 20
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolRequest:
    """The checked tools (as the chat template takes them) and how they may be called:
    `choice` is auto, none, required or named (then `function` is the name)."""

    tools: list[dict[str, Any]]
    choice: str
    function: str | None = None
    parallel: bool = True

    def parameters(self, name: str) -> dict[str, Any] | None:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"].get("parameters")
        return None


def tool_request(tools: list[Any] | None, tool_choice: Any,
                 parallel_tool_calls: bool | None) -> ToolRequest | None:
    """The request's tools, or None without any; `ApiError(400)` naming the bad field."""
    if not tools:
        if tool_choice is not None and tool_choice not in ("none", "auto"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"at most {MAX_TOOLS} tools, got {len(tools)}", param="tools")
    checked, names, chars = [], set(), 0
    for i, tool in enumerate(tools):
        fn = _check_tool(tool, f"tools[{i}]")
        if fn["name"] in names:
            raise ApiError(400, f"tools[{i}].function.name {fn['name']!r} is given twice",
                           param=f"tools[{i}].function.name")
        names.add(fn["name"])
        try:
            chars += len(json.dumps(fn.get("parameters")))
        except (RecursionError, ValueError):
            raise ApiError(400, f"tools[{i}].function.parameters is nested too deeply",
                           param=f"tools[{i}].function.parameters") from None
        checked.append({"type": "function", "function": fn})
    if chars > MAX_SCHEMA_CHARS:
        raise ApiError(400, f"the tools' parameter schemas are {chars:,} characters; at "
                            f"most {MAX_SCHEMA_CHARS:,}", param="tools")
    choice, function = _choice(tool_choice, names)
    return ToolRequest(checked, choice, function, parallel_tool_calls is not False)


def _check_tool(tool: Any, where: str) -> dict[str, Any]:
    """The tool's `function` object, checked."""
    if not isinstance(tool, dict):
        raise ApiError(400, f"{where} must be an object", param=where)
    if tool.get("type") != "function":
        raise ApiError(400, f"{where}.type must be 'function', got {tool.get('type')!r}",
                       param=f"{where}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ApiError(400, f"{where}.function must be an object", param=f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ApiError(400, f"{where}.function.name must be 1 to 64 letters, digits, '_', "
                            f"'-' or '.', got {name!r:.80}", param=f"{where}.function.name")
    if not isinstance(fn.get("description", ""), str | None):
        raise ApiError(400, f"{where}.function.description must be a string",
                       param=f"{where}.function.description")
    params = fn.get("parameters")
    if params is not None:
        _check_parameters(params, f"{where}.function.parameters")
    return fn


def _check_parameters(schema: Any, where: str) -> None:
    """A function's parameters: a JSON schema of an object."""
    if not isinstance(schema, dict):
        raise ApiError(400, f"{where} must be a JSON schema object", param=where)
    if schema.get("type", "object") != "object":
        raise ApiError(400, f"{where}.type must be 'object', got {schema.get('type')!r:.80}",
                       param=f"{where}.type")
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(p, dict | bool) for p in props.values()):
        raise ApiError(400, f"{where}.properties must map names to JSON schemas",
                       param=f"{where}.properties")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ApiError(400, f"{where}.required must be a list of names",
                       param=f"{where}.required")


def _choice(tool_choice: Any, names: set[str]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ApiError(400, f"tool_choice must be one of {CHOICES} or a function, got "
                                f"{tool_choice!r:.80}", param="tool_choice")
        return tool_choice, None
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or tool_choice.get("type") != "function":
        raise ApiError(400, 'tool_choice must be a string or {"type": "function", '
                            '"function": {"name": ...}}', param="tool_choice")
    if name not in names:
        raise ApiError(400, f"tool_choice names {name!r:.80}, which is not one of the tools",
                       param="tool_choice.function.name")
    return "named", name
