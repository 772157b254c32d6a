"""Each tool-call format's parser: the calls and content of an output, the same whether
it comes whole or a character at a time; streamed argument pieces that join into the
arguments' JSON; calls left open or malformed given back as text; held text bounded."""

from __future__ import annotations

import json

import pytest

from runtime.api.tools.call_array import CallArrayParser
from runtime.api.tools.deepseek_v3 import DeepSeekV3Parser
from runtime.api.tools.hermes import HermesParser
from runtime.api.tools.llama3_json import Llama3JsonParser
from runtime.api.tools.mistral import MistralParser
from runtime.api.tools.named import NamedCallParser
from runtime.api.tools.parser import ToolParser

WEATHER = '{"city": "Pa\\"ris }", "days": [1, {"x": "]"}], "ok": true}'
DS_CALL = ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```"
           "<｜tool▁call▁end｜>")


def run(parser: ToolParser, pieces: list[str]) -> dict:
    """Feed `pieces`, then finish: the streamed content, the calls rebuilt from their
    streamed pieces, the calls kept, and the whole answer's content."""
    content, streamed = "", {}
    for out in [parser.feed(p) for p in pieces] + [parser.finish()]:
        content += out.content
        for d in out.calls:
            if d.name is not None:
                assert d.index == len(streamed) and d.arguments == "" and d.id.startswith(
                    "call_")
                streamed[d.index] = [d.name, ""]
            else:
                streamed[d.index][1] += d.arguments
        assert len(parser.text_in.buf) < 32  # only a marker's start is ever held back
    return {"content": content, "streamed": [tuple(c) for c in streamed.values()],
            "calls": [(c.name, c.arguments) for c in parser.calls], "text": parser.text}


def both(make, text: str) -> dict:
    """The result of `text` whole, checked equal to it fed a character at a time."""
    whole, chars = run(make(), [text]), run(make(), list(text))
    assert whole == chars
    return whole


CASES = [
    (HermesParser, f'Let me look.\n<tool_call>\n{{"name": "get_weather", "arguments": '
                   f'{WEATHER}}}\n</tool_call>\n<tool_call>\n{{"arguments": {{}}, "name": '
                   f'"now"}}\n</tool_call>', "Let me look.",
     [("get_weather", WEATHER), ("now", "{}")]),
    (HermesParser, 'No tools needed: 1 < 2 <tool_ and {"a": 1}.', 'No tools needed: 1 < 2 '
                   '<tool_ and {"a": 1}.', []),
    (Llama3JsonParser, f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}; '
                       f'{{"name": "now", "parameters": {{}}}}', "",
     [("get_weather", WEATHER), ("now", "{}")]),
    (Llama3JsonParser, f'  {{"name": "get_weather", "parameters": {WEATHER}}}', "",
     [("get_weather", WEATHER)]),
    (Llama3JsonParser, 'Paris is sunny. {"name": "x"}', 'Paris is sunny. {"name": "x"}', []),
    (MistralParser, f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {WEATHER}}}, '
                    f'{{"name": "now", "arguments": {{}}}}]', "",
     [("get_weather", WEATHER), ("now", "{}")]),
    (DeepSeekV3Parser, "Checking.<｜tool▁calls▁begin｜>" + DS_CALL.format(
        name="get_weather", args=WEATHER) + "\n" + DS_CALL.format(name="now", args="{}")
     + "<｜tool▁calls▁end｜>", "Checking.", [("get_weather", WEATHER), ("now", "{}")]),
    (CallArrayParser, f'[{{"name": "get_weather", "arguments": {WEATHER}}}]', "",
     [("get_weather", WEATHER)]),
    (lambda: NamedCallParser("get_weather"), WEATHER, "", [("get_weather", WEATHER)]),
]


@pytest.mark.parametrize("make,text,content,calls", CASES)
def test_whole_and_streamed_outputs_give_the_same_calls(make, text, content, calls):
    got = both(make, text)
    assert got["content"] == got["text"] == content
    assert got["calls"] == got["streamed"] == calls
    for _, arguments in got["streamed"]:
        assert isinstance(json.loads(arguments), dict)


@pytest.mark.parametrize("make,opening", [
    (HermesParser, 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),
    (Llama3JsonParser, '{"name": "get_weather", "parameters": {"city": "Pa'),
    (MistralParser, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa'),
    (DeepSeekV3Parser, "<｜tool▁calls▁begin｜>" + DS_CALL.format(
        name="get_weather", args='{"city": "Pa').split("\n```<")[0]),
])
def test_a_call_that_never_closes_is_text_of_the_whole_answer(make, opening):
    got = both(make, opening)
    assert got["calls"] == []
    assert got["text"] == opening  # the whole answer: the output as it came
    assert got["streamed"] == [("get_weather", '{"city": "Pa')]  # what a stream had sent


def test_a_call_cut_before_its_name_is_content_when_streamed_too():
    text = 'Sure.<tool_call>\n{"arguments": {"a": 1}, "na'
    got = both(HermesParser, text)
    assert got["streamed"] == got["calls"] == []
    assert got["content"] == got["text"] == text


@pytest.mark.parametrize("body", ['{"name": 5, "arguments": {}}', '{"name": "f", '
                                  '"arguments": "{}"}', "[1, 2]", 'get_weather("Paris")'])
def test_a_malformed_call_is_not_kept(body):
    got = both(HermesParser, f"<tool_call>{body}</tool_call> done")
    assert got["calls"] == []
    assert got["text"].startswith("<tool_call>") and got["text"].endswith("done")


def test_named_output_with_text_after_it_keeps_the_call():
    got = both(lambda: NamedCallParser("f"), '{"a": 1} trailing')
    assert got["calls"] == [("f", '{"a": 1}')] and got["content"] == " trailing"


def test_arguments_stream_in_pieces_as_they_come():
    p = HermesParser()
    assert p.feed('<tool_call>{"name": "f", "arguments": {"q": "').calls[0].name == "f"
    piece = p.feed("long text")
    assert [d.arguments for d in piece.calls] == ["long text"]
    assert [d.arguments for d in p.feed('"}}</tool_call>').calls] == ['"}']
    assert [(c.name, c.arguments) for c in p.calls] == [("f", '{"q": "long text"}')]


def test_held_text_stays_bounded_over_a_long_output():
    p = HermesParser()
    for _ in range(5000):
        assert p.feed("a <tool").content  # a marker's start is held, the rest goes out
        assert len(p.text_in.buf) <= len("<tool_call>")
    p.feed('_call>{"name": "f", "arguments": {"k": "')
    for _ in range(5000):
        assert p.feed("xy").calls[0].arguments == "xy"
        assert p.text_in.buf == ""
