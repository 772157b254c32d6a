"""Tool calls from a real model: SmolLM2 on the CPU behind `sluice serve`, with a chat
template that renders tools (`tool_model`). SmolLM2 does not write tool calls unasked, so
these use `tool_choice` required or named: its greedy output under the call grammar must
parse into a call, through the `openai` client (streamed and not) and through
langchain-openai's `ChatOpenAI.bind_tools`."""

from __future__ import annotations

import json

import openai
import pytest

from tests.api.http_helpers import live_server
from tests.api.tools.tool_model import tool_model_dir

CITIES = ["Paris", "Rome", "Tokyo"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now.", "strict": True,
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Rome?"}]
LIMIT = 40  # tokens: a call to either tool takes about 20
pytestmark = pytest.mark.slow  # a grammar compile for SmolLM2's vocabulary, and the server


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The served model's name: its folder."""
    return str(tool_model_dir(tmp_path_factory.mktemp("smollm2-tools")))


@pytest.fixture(scope="module")
def server(model):
    with live_server(model=model) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as c:
        yield c


def test_required_call_parses_non_streamed_and_streamed(client, model):
    out = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME],
                                         tool_choice="required", max_tokens=LIMIT,
                                         temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in choice.message.tool_calls]
    assert calls and all(name in ("get_weather", "get_time") for name, _ in calls)
    for name, args in calls:
        assert args == {} if name == "get_time" else args["city"] in CITIES

    with client.chat.completions.stream(model=model, messages=ASK, tools=[WEATHER, TIME],
                                        tool_choice="required", max_tokens=LIMIT,
                                        temperature=0) as s:
        final = s.get_final_completion()
    streamed = [(c.function.name, c.function.parsed_arguments)
                for c in final.choices[0].message.tool_calls]
    assert streamed == calls and final.choices[0].finish_reason == "tool_calls"


def test_named_call_parses(client, model):
    out = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], max_tokens=LIMIT, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in CITIES
    assert out.choices[0].finish_reason == "tool_calls"


def test_langchain_bind_tools_gets_the_call(server, model):
    ChatOpenAI = pytest.importorskip("langchain_openai").ChatOpenAI  # noqa: N806

    llm = ChatOpenAI(model=model, base_url=f"{server.url}/v1", api_key="none",
                     temperature=0, max_tokens=LIMIT, max_retries=0)
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
    (call,) = bound.invoke("What is the weather in Rome?").tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in CITIES
    assert call["id"].startswith("call_")

    chunks = list(bound.stream("What is the weather in Rome?"))
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [(call["name"], call["args"])]
