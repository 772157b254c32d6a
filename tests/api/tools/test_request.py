"""Checking `tools` and `tool_choice` (400s naming the field), the JSON schema that
`required` and a named function put on the output, and assistant calls rendered by
templates that take the arguments as an object or as text."""

from __future__ import annotations

import copy
import json

import pytest
import xgrammar

from runtime.api.chat_template import chat_prompt_text
from runtime.api.openai.protocol import ApiError, ChatMessage
from runtime.api.tools.protocol import FunctionCall, ToolCallItem
from runtime.api.tools.request import MAX_SCHEMA_CHARS, MAX_TOOLS, tool_request
from runtime.api.tools.schema import call_schema

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}


def tool(**function) -> dict:
    return {"type": "function", "function": {"name": "f", **function}}


@pytest.mark.parametrize("tools,choice,param", [
    (["f"], None, "tools[0]"),
    ([{"type": "code", "function": {"name": "f"}}], None, "tools[0].type"),
    ([{"type": "function"}], None, "tools[0].function"),
    ([WEATHER, {"type": "function", "function": {"description": "no name"}}], None,
     "tools[1].function.name"),
    ([tool(name="a b")], None, "tools[0].function.name"),
    ([tool(name="x" * 65)], None, "tools[0].function.name"),
    ([tool(description=3)], None, "tools[0].function.description"),
    ([tool(parameters="{}")], None, "tools[0].function.parameters"),
    ([tool(parameters={"type": "string"})], None, "tools[0].function.parameters.type"),
    ([tool(parameters={"type": "object", "properties": []})], None,
     "tools[0].function.parameters.properties"),
    ([tool(parameters={"type": "object", "required": "city"})], None,
     "tools[0].function.parameters.required"),
    ([WEATHER, WEATHER], None, "tools[1].function.name"),
    ([tool(name=f"f{i}") for i in range(1000)], None, "tools"),
    ([tool(parameters={"type": "object", "description": "x" * (MAX_SCHEMA_CHARS + 1)})], None,
     "tools"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}},
     "tool_choice.function.name"),
    ([WEATHER], {"type": "function"}, "tool_choice"),
    ([WEATHER], 7, "tool_choice"),
    (None, "required", "tool_choice"),
])
def test_bad_tools_are_a_400_naming_the_field(tools, choice, param):
    with pytest.raises(ApiError) as e:
        tool_request(tools, choice, None)
    assert e.value.status == 400 and e.value.param == param


def test_good_tools_and_their_choices():
    assert tool_request(None, None, None) is None
    assert tool_request([], "none", None) is None
    req = tool_request([WEATHER, NOW], None, False)
    assert (req.choice, req.function, req.parallel) == ("auto", None, False)
    assert [t["function"]["name"] for t in req.tools] == ["get_weather", "now"]
    named = tool_request([WEATHER], {"type": "function", "function": {"name": "get_weather"}},
                         None)
    assert (named.choice, named.function, named.parallel) == ("named", "get_weather", True)
    assert len(tool_request([tool(name=f"f{i}") for i in range(MAX_TOOLS)], None, None).tools) \
        == MAX_TOOLS


def test_required_schema_is_an_array_of_the_tools_calls():
    schema = json.loads(call_schema(tool_request([WEATHER, NOW], "required", None)))
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    weather, now = schema["items"]["anyOf"]
    assert weather["properties"] == {"name": {"const": "get_weather"}, "arguments": CITY}
    assert now["properties"]["arguments"] == {"type": "object", "properties": {},
                                              "additionalProperties": False}
    assert weather["required"] == ["name", "arguments"]
    one = json.loads(call_schema(tool_request([WEATHER, NOW], "required", False)))
    assert one["maxItems"] == 1
    xgrammar.Grammar.from_json_schema(json.dumps(schema))  # the compiler takes it


def test_named_schema_is_the_functions_parameters():
    req = tool_request([WEATHER, NOW], {"type": "function", "function": {"name": "get_weather"}},
                       None)
    assert json.loads(call_schema(req)) == CITY


def test_a_schema_the_compiler_refuses_is_a_400_naming_the_tool():
    bad = tool(parameters={"type": "object", "properties": {"x": {"type": "nope"}}})
    with pytest.raises(ApiError) as e:
        call_schema(tool_request([WEATHER, bad], "required", None))
    assert e.value.param == "tools[1].function.parameters"


@pytest.mark.parametrize("template,expected", [
    ("{{ messages[0].tool_calls[0].function.arguments | tojson }}", '{"city": "Paris"}'),
    ("{{ '```json\\n' + messages[0].tool_calls[0].function.arguments + '\\n```' }}",
     '```json\n{"city":"Paris"}\n```'),
    ("{% for k, v in messages[0].tool_calls[0].function.arguments.items() %}{{ k }}={{ v }}"
     "{% endfor %}{{ messages[0].content is defined }}", "city=ParisFalse"),
])
def test_assistant_calls_render_as_object_or_joined_as_text(tok, template, expected):
    tok = copy.copy(tok)
    tok.chat_template = template
    call = ToolCallItem(id="call_1", function=FunctionCall(name="get_weather",
                                                           arguments='{"city":"Paris"}'))
    msg = ChatMessage(role="assistant", tool_calls=[call])
    assert chat_prompt_text(tok, [msg]) == expected


@pytest.mark.parametrize("msg,param", [
    (ChatMessage(role="assistant", tool_calls=[ToolCallItem(
        id="c", function=FunctionCall(name="f", arguments="not json"))]),
     "messages[0].tool_calls[0].function.arguments"),
    (ChatMessage(role="assistant", tool_calls=[ToolCallItem(
        id="c", function=FunctionCall(name="f", arguments="[1]"))]),
     "messages[0].tool_calls[0].function.arguments"),
    (ChatMessage(role="user", content="x", tool_calls=[ToolCallItem(
        id="c", function=FunctionCall(name="f", arguments="{}"))]), "messages[0].tool_calls"),
])
def test_bad_assistant_calls_are_a_400(tok, msg, param):
    with pytest.raises(ApiError) as e:
        chat_prompt_text(tok, [msg])
    assert e.value.param == param


def test_template_kwargs_reach_the_template_but_not_the_renderer(tok):
    tok = copy.copy(tok)
    tok.chat_template = "{{ flavour }}"
    assert chat_prompt_text(tok, [ChatMessage(role="user", content="x")], None,
                            {"flavour": "mint"}) == "mint"
    for name in ("tokenize", "return_dict", "add_generation_prompt", "messages"):
        with pytest.raises(ApiError) as e:
            chat_prompt_text(tok, [ChatMessage(role="user", content="x")], None, {name: True})
        assert e.value.param == f"chat_template_kwargs.{name}"
