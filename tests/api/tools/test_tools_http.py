"""Tool calls and reasoning over HTTP with the `openai` client, unchanged: the api runs in
this process over a fake scheduler that answers with a fixed text (SmolLM2 writes no tool
calls of its own), on SmolLM2's tokenizer with a chat template that renders tools
(`tool_model`). Non-streamed and streamed calls (the client's own accumulation, and
langchain-openai's `bind_tools`), a tool answer's round trip through the template,
`chat_template_kwargs`, reasoning, the grammar `tool_choice` required puts on the
request, and bad input."""

from __future__ import annotations

import dataclasses
import json

import httpx
import openai
import pytest

from runtime.api.tools.request import tool_request
from runtime.api.tools.schema import call_schema
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.http.test_health import http_front
from tests.api.tools.tool_model import tool_model_dir

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": CITY, "strict": True}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris"}}\n</tool_call>')


@pytest.fixture
def tool_spec(spec, tmp_path):
    folder = str(tool_model_dir(tmp_path))
    return dataclasses.replace(spec, path=folder, tokenizer_path=folder)


@pytest.fixture
def serve(cfg, tool_spec, tok):
    """`serve(text, **config)`: (the scheduler, an openai client) of a front whose model
    answers every request with `text`."""
    stack = []

    def start(text: str, **changes):
        changed = cfg.replace(**changes)
        sched = FakeScheduler(changed, lambda r: tok.encode(text))
        front = http_front(changed, tool_spec)
        stack.extend([sched, front])
        sched.__enter__()
        url = front.__enter__()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        return sched, client

    yield start
    for item in reversed(stack):
        item.__exit__(None, None, None)


def prompt_of(sched: FakeScheduler, tok) -> str:
    return tok.decode(sched.of_type(GenerateReq)[-1].input_ids)


def test_non_streamed_call(serve, tok):
    sched, client = serve(CALL_TEXT)
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert '"name": "get_weather"' in prompt_of(sched, tok)  # the template got the tools
    assert sched.of_type(GenerateReq)[-1].params.skip_special_tokens is False


def test_streamed_call_accumulates_in_the_client(serve):
    _, client = serve(CALL_TEXT)
    with client.chat.completions.stream(model="smollm2", messages=ASK, tools=TOOLS) as s:
        events = list(s)
        final = s.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.function.parsed_arguments == {
        "city": "Paris"}
    assert final.choices[0].message.content == "I will check."
    assert final.choices[0].finish_reason == "tool_calls"
    args = [e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(args) > 1 and "".join(args) == '{"city": "Paris"}'  # in pieces

    chunks = list(client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                                 stream=True))
    first = next(c.choices[0].delta.tool_calls[0] for c in chunks
                 if c.choices and c.choices[0].delta.tool_calls)
    assert (first.index, first.type, first.function.name, first.function.arguments) == (
        0, "function", "get_weather", "")
    assert first.id.startswith("call_")


def test_tool_answer_round_trip_renders_through_the_template(serve, tok):
    sched, client = serve("It is 18 degrees in Paris.")
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"}]
    out = client.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS)
    assert out.choices[0].message.content == "It is 18 degrees in Paris."
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.tool_calls is None
    prompt = prompt_of(sched, tok)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in prompt
    assert "<tool_response>\n18C, sunny\n</tool_response>" in prompt


def test_langchain_bind_tools_reads_the_call_whole_and_streamed(serve):
    ChatOpenAI = pytest.importorskip("langchain_openai").ChatOpenAI  # noqa: N806
    _, client = serve(CALL_TEXT)
    llm = ChatOpenAI(model="smollm2", base_url=str(client.base_url), api_key="none",
                     max_retries=0).bind_tools(TOOLS)
    message = llm.invoke("What is the weather in Paris?")
    assert message.content == "I will check."
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    chunks = list(llm.stream("What is the weather in Paris?"))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed = streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert streamed.tool_calls[0]["id"].startswith("call_")


def test_chat_template_kwargs_reach_the_template(serve, tok):
    sched, client = serve("Hi.")
    client.chat.completions.create(model="smollm2", messages=ASK,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert prompt_of(sched, tok).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    client.chat.completions.create(model="smollm2", messages=ASK)
    assert prompt_of(sched, tok).endswith("<|im_start|>assistant\n")


def test_reasoning_is_split_whole_and_streamed(serve):
    _, client = serve("<think>Paris is in France.</think>\n\n" + CALL_TEXT,
                      reasoning_parser="qwen3")
    msg = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS).choices[0]
    assert msg.message.reasoning_content == "Paris is in France."
    assert msg.message.content == "I will check." and msg.finish_reason == "tool_calls"
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model="smollm2", messages=ASK, stream=True):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
    assert reasoning == "Paris is in France." and content == CALL_TEXT  # no tools: text


def test_required_tool_choice_constrains_the_output_to_calls(serve):
    sched, client = serve('[{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                         tool_choice="required", parallel_tool_calls=False)
    (call,) = out.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Rome"})
    assert out.choices[0].finish_reason == "tool_calls"
    params = sched.of_type(GenerateReq)[-1].params
    assert params.json_schema == call_schema(tool_request(TOOLS, "required", False))
    assert params.skip_special_tokens is True


def test_named_tool_choice_constrains_the_output_to_its_arguments(serve):
    sched, client = serve('{"city": "Oslo"}')
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                         tool_choice=choice)
    (call,) = out.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Oslo"}')
    assert json.loads(sched.of_type(GenerateReq)[-1].params.json_schema) == CITY


def test_a_call_cut_by_max_tokens_is_text_with_finish_length(serve, tok):
    _, client = serve(CALL_TEXT)
    cut = len(tok.encode(CALL_TEXT[:CALL_TEXT.index("Paris")]))  # inside the arguments
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                         max_tokens=cut)
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content == tok.decode(tok.encode(CALL_TEXT)[:cut])


def test_tool_choice_none_reads_no_calls(serve):
    _, client = serve(CALL_TEXT)
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                         tool_choice="none")
    assert out.choices[0].message.content == CALL_TEXT
    assert out.choices[0].finish_reason == "stop"


BAD = [
    ({"tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]},
     "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{
        "id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
]


@pytest.mark.parametrize("extra,param", BAD)
def test_bad_tool_input_is_a_400_naming_the_field(serve, extra, param):
    _, client = serve("Hi.")
    body = {"model": "smollm2", "messages": ASK, **extra}
    r = httpx.post(f"{client.base_url}chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert client.chat.completions.create(model="smollm2", messages=ASK).choices[0]


def test_a_10_mb_schema_is_refused_and_serving_goes_on(serve):
    _, client = serve("Hi.", max_request_bytes=16 << 20)
    big = {"type": "object", "description": "x" * (10 << 20)}
    body = {"model": "smollm2", "messages": ASK,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": big}}]}
    r = httpx.post(f"{client.base_url}chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert client.chat.completions.create(model="smollm2", messages=ASK).choices[0]


def test_tools_for_a_template_without_tools_are_a_400(cfg, spec, tok):
    with FakeScheduler(cfg, lambda r: tok.encode("Hi.")), http_front(cfg, spec) as url:
        body = {"model": "smollm2", "messages": ASK, "tools": TOOLS}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
        assert "does not render tools" in r.json()["error"]["message"]


@pytest.mark.parametrize("tool_template", [True, False])
def test_the_attack_batterys_tool_inputs_are_refused(cfg, spec, tool_spec, tok, tool_template):
    from tests.attack.http_inputs import BAD_TOOL_FIELDS, BAD_TOOLS, ROUTES

    base = {**ROUTES["/v1/chat/completions"], "model": "smollm2"}
    with FakeScheduler(cfg, lambda r: tok.encode("Hi.")), \
            http_front(cfg, tool_spec if tool_template else spec) as url:
        for extra in [{"tools": t} for t in BAD_TOOLS] + BAD_TOOL_FIELDS:
            r = httpx.post(f"{url}/v1/chat/completions", json={**base, **extra}, timeout=60)
            assert r.status_code in (400, 413), (r.status_code, r.text[:200])
