"""Unit tests without a model: the constant prefix `run_batch` precaches, and how
`select` finds a choice's own tokens."""

from __future__ import annotations

import frontend as sl
from frontend.backends.base import Backend
from frontend.select import choice_logprobs
from frontend.tracing import trace_prefix
from runtime.wire.model_info import ModelInfo, RoleMarkers


class ChatOnly(Backend):
    """Role markers only; tracing must never generate."""

    def generate(self, prompt, params, on_text=None):
        raise AssertionError("tracing generated")

    def _fetch_model_info(self) -> ModelInfo:
        m = RoleMarkers(first_prefix="<s>[U]", prefix="[U]", suffix="[/U]")
        return ModelInfo(model="fake", max_model_len=64, chat_roles={"user": m})


def test_trace_stops_where_the_arguments_or_outputs_are_first_needed():
    def concat(s, question):
        s += "Shots.\n"
        s += "Q: " + question + "\nA:"

    def fstring(s, question):
        s += "Shots.\n"
        s += f"Q: {question}"

    def role(s, question):
        s += sl.user("Shots.")
        s += sl.user(question)

    def gen_first(s, question):
        s += "Shots.\n"
        s += sl.gen("a") + question

    def reads(s, n):
        s += "Shots.\n"
        s += sl.gen("a")
        s += s["a"] * n

    backend = ChatOnly()
    assert trace_prefix(concat, backend) == "Shots.\nQ: "
    assert trace_prefix(fstring, backend) == "Shots.\n"
    assert trace_prefix(role, backend) == "<s>[U]Shots.[/U][U]"
    assert trace_prefix(gen_first, backend) == "Shots.\n"
    assert trace_prefix(reads, backend) == "Shots.\n"


def test_a_choice_owns_the_tokens_past_the_texts_own():
    # the text's scored tail [7, 8]; "text + choice" re-tokenized its last token as 9
    assert choice_logprobs([7, 8], [7, 9, 4], [-1.0, -2.0, -3.0]) == [-2.0, -3.0]
    assert choice_logprobs([7, 8], [7, 8, 4], [-1.0, -2.0, -3.0]) == [-3.0]
    assert choice_logprobs([], [5, 6], [-1.0, -2.0]) == [-1.0, -2.0]
