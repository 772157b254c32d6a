"""Which parser `--tool-call-parser` names or `auto` picks from a chat template, and
whether a template renders tools at all."""

from __future__ import annotations

import copy

import pytest

from runtime.api.reasoning.think import REASONING_PARSERS
from runtime.api.tools.registry import TOOL_PARSERS, pick_parser, renders_tools
from runtime.config.front import REASONING_PARSERS as REASONING_SETTINGS
from runtime.config.front import TOOL_CALL_PARSERS
from tests.api.tools.tool_model import TEMPLATE


def test_every_parser_setting_has_a_parser():
    assert set(TOOL_CALL_PARSERS) == set(TOOL_PARSERS) | {"auto", "none"}
    assert set(REASONING_SETTINGS) == set(REASONING_PARSERS) | {"none"}


@pytest.mark.parametrize("template,name", [
    (TEMPLATE, "hermes"),
    ("{{ '[AVAILABLE_TOOLS]' }}{% if m.tool_calls %}[TOOL_CALLS]{% endif %}", "mistral"),
    ("{{- '<|python_tag|>' + tool_call.name }}", "llama3_json"),
    ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}", "deepseek_v3"),
    ("{{ messages }}", None),
    ("<tool_call> and [TOOL_CALLS]", None),  # two formats: not obvious
])
def test_auto_picks_the_format_the_template_writes(template, name):
    picked = pick_parser("auto", template)
    assert (picked.name if picked else None) == name
    assert pick_parser("none", template) is None
    assert pick_parser("mistral", template).name == "mistral"


def test_renders_tools(tok):
    assert not renders_tools(tok)  # SmolLM2's own template has no tools
    with_tools = copy.copy(tok)
    with_tools.chat_template = TEMPLATE
    assert renders_tools(with_tools)
    assert not renders_tools(None)
