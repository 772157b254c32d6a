"""The reasoning parsers split `<think>...</think>` from the answer, the same whole or a
character at a time: qwen3 only when the output opens the block, deepseek-r1 from the
output's start (its template opened the block in the prompt)."""

from __future__ import annotations

import pytest

from runtime.api.reasoning.think import DeepSeekR1Parser, Qwen3Parser, ThinkParser


def split(parser: ThinkParser, pieces: list[str]) -> tuple[str, str]:
    reasoning, answer = "", ""
    for r, a in [parser.feed(p) for p in pieces] + [parser.finish()]:
        reasoning, answer = reasoning + r, answer + a
    return reasoning, answer


@pytest.mark.parametrize("cls,text,expected", [
    (Qwen3Parser, "<think>\nx < y, so </think\n</think>\n\nThe answer is 4.",
     ("\nx < y, so </think\n", "The answer is 4.")),
    (Qwen3Parser, "The answer is 4, no <think> needed.",
     ("", "The answer is 4, no <think> needed.")),
    (Qwen3Parser, "<think>still thinking", ("still thinking", "")),
    (Qwen3Parser, "<thin", ("", "<thin")),
    (DeepSeekR1Parser, "Two and two.\n</think>\n\n4", ("Two and two.\n", "4")),
    (DeepSeekR1Parser, "<think>Two and two.</think>4", ("Two and two.", "4")),
    (DeepSeekR1Parser, "never closed", ("never closed", "")),
])
def test_reasoning_and_answer_split_alike_whole_and_streamed(cls, text, expected):
    assert split(cls(), [text]) == expected
    assert split(cls(), list(text)) == expected


def test_a_streamed_answer_is_not_held_past_a_marker_start():
    p = Qwen3Parser()
    assert p.feed("<think>a") == ("a", "")
    assert p.feed(" b</thi") == (" b", "")  # "</thi" may begin the close
    assert p.feed("nk> c") == ("", "c")
    assert p.feed(" d") == ("", " d")
