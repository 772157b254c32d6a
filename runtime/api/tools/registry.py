"""The tool-call parsers by name, the one `auto` picks from a chat template, and whether a
chat template renders tools at all."""

from __future__ import annotations

import logging
from typing import Any

from runtime.api.tools.deepseek_v3 import DeepSeekV3Parser
from runtime.api.tools.hermes import HermesParser
from runtime.api.tools.llama3_json import Llama3JsonParser
from runtime.api.tools.mistral import MistralParser
from runtime.api.tools.parser import ToolParser

log = logging.getLogger(__name__)
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser, DeepSeekV3Parser)}
_PROBE_TOOL = {"type": "function", "function": {
    "name": "sluice_probe_tool", "description": "", "parameters": {"type": "object",
                                                                   "properties": {}}}}
_PROBE_CHAT = [{"role": "user", "content": "?"}]


def pick_parser(setting: str, chat_template: str | None) -> type[ToolParser] | None:
    """The parser `setting` names (`--tool-call-parser`), or for `auto` the one whose
    format the chat template writes (None when no template shows one; `none`: None)."""
    if setting in TOOL_PARSERS:
        return TOOL_PARSERS[setting]
    if setting != "auto" or not chat_template:
        return None
    found = [p for p in TOOL_PARSERS.values() if p.template_marker in chat_template]
    return found[0] if len(found) == 1 else None


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template puts tool definitions in the prompt: a
    conversation rendered with a tool differs from it rendered without."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    try:
        plain = tokenizer.apply_chat_template(_PROBE_CHAT, tokenize=False,
                                              add_generation_prompt=True)
        with_tool = tokenizer.apply_chat_template(_PROBE_CHAT, tools=[_PROBE_TOOL],
                                                  tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template that fails on this probe is taken as no tools
        log.warning("chat template probe with a tool failed: %r", e)
        return False
    return plain != with_tool
