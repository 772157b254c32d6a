"""The JSON schema that `tool_choice` `required` or a named function puts on the output
(constrained decoding, `SamplingParams.json_schema`), and the parser that reads it.

Named: the output is the function's arguments, under its parameters schema. Required:
the output is a JSON array of one or more calls (one with `parallel_tool_calls` false),
each `{"name": <a tool's name>, "arguments": <under that tool's parameters>}`. The
output is JSON in the model's own format's place, so it always parses, whatever the
format the model would have written.
"""

from __future__ import annotations

import json
from typing import Any

from runtime.api.openai.protocol import ApiError
from runtime.api.tools.call_array import CallArrayParser
from runtime.api.tools.named import NamedCallParser
from runtime.api.tools.parser import ToolParser
from runtime.api.tools.request import ToolRequest
from runtime.grammar import check_grammar
from runtime.wire.errors import InvalidRequest
from runtime.wire.sampling import SamplingParams

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def constrained(req: ToolRequest) -> bool:
    """Whether the request's output is constrained to a call."""
    return req.choice in ("required", "named")


def call_schema(req: ToolRequest) -> str:
    """The JSON schema (text) of a constrained request's output; `ApiError(400)` naming
    the tool whose parameters are not a schema the grammar compiler takes."""
    if req.choice == "named":
        return _checked(req, req.function)
    calls = [{"type": "object",
              "properties": {"name": {"const": t["function"]["name"]},
                             "arguments": json.loads(_checked(req, t["function"]["name"]))},
              "required": ["name", "arguments"], "additionalProperties": False}
             for t in req.tools]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not req.parallel:
        schema["maxItems"] = 1
    return json.dumps(schema)


def constrained_parser(req: ToolRequest) -> ToolParser:
    """The parser of a constrained request's output."""
    return NamedCallParser(req.function) if req.choice == "named" else CallArrayParser()


def _checked(req: ToolRequest, name: str) -> str:
    params = req.parameters(name)
    text = json.dumps(NO_ARGUMENTS if params is None else params)
    try:
        check_grammar(SamplingParams(json_schema=text))
    except InvalidRequest as e:
        index = [t["function"]["name"] for t in req.tools].index(name)
        where = f"tools[{index}].function.parameters"
        raise ApiError(400, f"{where}: {e}", param=where) from None
    return text
