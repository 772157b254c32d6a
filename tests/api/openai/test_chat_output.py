"""`ChatOutput`: a choice's output as OpenAI message parts: reasoning before tool parsing,
a stream's deltas (a call's first piece a delta of its own) adding up to the whole
message, the stop token's text cut, `tool_calls` as the finish reason of an answer that
made calls, `parallel_tool_calls` false keeping the first call, an unclosed call text."""

from __future__ import annotations

import json

from runtime.api.openai.chat_output import ChatOutput
from runtime.api.reasoning.think import Qwen3Parser
from runtime.api.tools.hermes import HermesParser
from runtime.wire.request_output import FinishReason, RequestOutput

END_ID, END_TEXT = 7, "<|im_end|>"
CALL = '<tool_call>\n{{"name": "{}", "arguments": {{"n": {}}}}}\n</tool_call>'
TEXT = ("<think>Which tool?</think>\n\nChecking." + CALL.format("f", 1) + "\n"
        + CALL.format("g", 2) + END_TEXT)


def reader(parallel: bool = True) -> ChatOutput:
    return ChatOutput(HermesParser(), Qwen3Parser(), parallel, lambda i: END_TEXT)


def pieces(text: str, size: int, finish: FinishReason) -> list[RequestOutput]:
    """`text` in pieces of `size` characters; a stop token's text comes whole, last."""
    end = END_TEXT if text.endswith(END_TEXT) else ""
    body = text[:len(text) - len(end)]
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    parts[-1] += end
    return [RequestOutput(rid="r", text=p, finish_reason=finish if i == len(parts) - 1 else None,
                          matched_stop=END_ID if finish == FinishReason.STOP else None)
            for i, p in enumerate(parts)]


def stream(r: ChatOutput, outs: list[RequestOutput]) -> tuple[dict, str | None]:
    """The message a client accumulates from the stream, and the finish reason."""
    acc = {"reasoning": "", "content": "", "calls": {}}
    finish = None
    for out in outs:
        for d in r.deltas(out):
            acc["reasoning"] += d.reasoning_content or ""
            acc["content"] += d.content or ""
            for c in d.tool_calls or []:
                if c.id is not None:
                    assert c.type == "function" and c.function.arguments == ""
                    acc["calls"][c.index] = [c.id, c.function.name, ""]
                else:
                    acc["calls"][c.index][2] += c.function.arguments
        finish = r.finish_reason(out)
    return acc, finish


def test_stream_adds_up_to_the_whole_message():
    whole, finish = reader().message(RequestOutput(
        rid="r", text=TEXT, finish_reason=FinishReason.STOP, matched_stop=END_ID))
    assert finish == "tool_calls"
    assert whole.reasoning_content == "Which tool?" and whole.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.tool_calls] \
        == [("f", {"n": 1}), ("g", {"n": 2})]
    for size in (1, 3, 50):
        got, stream_finish = stream(reader(), pieces(TEXT, size, FinishReason.STOP))
        assert stream_finish == "tool_calls"
        assert (got["reasoning"], got["content"]) == ("Which tool?", "Checking.")
        assert [c[1:] for c in got["calls"].values()] == [
            [c.function.name, c.function.arguments] for c in whole.tool_calls]


def test_parallel_false_keeps_the_first_call():
    whole, _ = reader(False).message(RequestOutput(rid="r", text=TEXT,
                                                   finish_reason=FinishReason.STOP))
    assert [c.function.name for c in whole.tool_calls] == ["f"]
    got, _ = stream(reader(False), pieces(TEXT, 4, FinishReason.STOP))
    assert [c[1] for c in got["calls"].values()] == ["f"]


def test_a_call_cut_by_the_length_limit_is_text_with_finish_length():
    text = "Sure. " + CALL.format("f", 1)[:30]
    whole, finish = ChatOutput(HermesParser(), None).message(RequestOutput(
        rid="r", text=text, finish_reason=FinishReason.LENGTH))
    assert (whole.content, whole.tool_calls, finish) == (text, None, "length")
    _, stream_finish = stream(ChatOutput(HermesParser(), None),
                              pieces(text, 2, FinishReason.LENGTH))
    assert stream_finish == "length"


def test_plain_text_answer_is_content_and_stops():
    whole, finish = reader().message(RequestOutput(
        rid="r", text="Just text." + END_TEXT, finish_reason=FinishReason.STOP,
        matched_stop=END_ID))
    assert (whole.content, whole.reasoning_content, whole.tool_calls, finish) == (
        "Just text.", None, None, "stop")
