"""How a chat request's output is read: tool calls (`--tool-call-parser`, `tools`,
`tool_choice`) and reasoning (`--reasoning-parser`).

`tool_choice` auto parses calls in the model's own format, which the server's parser
reads (named, or for `auto` picked from the chat template); `required` and a named
function constrain the output to JSON calls instead (see `tools.schema`), which needs no
parser; `none` reads no calls. Tools need a chat template that renders them, else the
model never sees them: such a request is refused. Formats whose markers are special
tokens need those in the text, so a request whose calls are parsed keeps special tokens
(the stop token's text is cut off its end again, see `ChatOutput`). Reasoning is split
off unconstrained outputs only: a grammar leaves no room for it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api.openai.chat_output import ChatOutput
from runtime.api.openai.protocol import ApiError, ChatCompletionRequest
from runtime.api.reasoning.think import REASONING_PARSERS, ThinkParser
from runtime.api.tools.parser import ToolParser
from runtime.api.tools.registry import pick_parser, renders_tools
from runtime.api.tools.request import ToolRequest, tool_request
from runtime.api.tools.schema import call_schema, constrained, constrained_parser
from runtime.config.server import ServerConfig
from runtime.wire.sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class RequestParsing:
    """One chat request's tools (for the template) and how each choice's output is read."""

    tools: ToolRequest | None
    tool_parser: Callable[[], ToolParser] | None
    reasoning: type[ThinkParser] | None
    end_text: Callable[[int], str]

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        return self.tools.tools if self.tools is not None else None

    def apply(self, params: SamplingParams) -> None:
        """Set what the request's tools need of its sampling: a call's grammar, or the
        special tokens a format's markers are; reasoning only without a grammar."""
        if self.tools is not None and constrained(self.tools):
            if params.json_schema is not None:
                raise ApiError(400, "response_format cannot be combined with tool_choice "
                                    "'required' or a named function", param="tool_choice")
            params.json_schema = call_schema(self.tools)
        elif self.tool_parser is not None:
            params.skip_special_tokens = False
        if params.json_schema is not None:
            self.reasoning = None

    def output(self) -> ChatOutput | None:
        """A reader for one choice's output; None when it is plain content."""
        if self.tool_parser is None and self.reasoning is None:
            return None
        parallel = self.tools is None or self.tools.parallel
        keeps_special = self.tool_parser is not None and not constrained(self.tools)
        return ChatOutput(self.tool_parser() if self.tool_parser else None,
                          self.reasoning() if self.reasoning else None, parallel,
                          self.end_text if keeps_special else None)


class ChatParsing:
    """The server's parsers, from its config and the model's chat template."""

    def __init__(self, cfg: ServerConfig, tokenizer: Any) -> None:
        self.model = cfg.model
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None)
        self.tool_parser = pick_parser(cfg.tool_call_parser, template)
        self.reasoning = REASONING_PARSERS.get(cfg.reasoning_parser)
        self._renders_tools: bool | None = None
        if cfg.tool_call_parser not in ("auto", "none") and not self.renders_tools:
            log.warning("--tool-call-parser %s: the chat template of %s does not render "
                        "tools; requests with tools will be refused", cfg.tool_call_parser,
                        cfg.model)

    @property
    def renders_tools(self) -> bool:
        if self._renders_tools is None:
            self._renders_tools = renders_tools(self.tokenizer)
        return self._renders_tools

    def request(self, req: ChatCompletionRequest) -> RequestParsing:
        """Check the request's tools; `ApiError(400)` naming what cannot be served."""
        tools = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
        parser = None
        if tools is not None and tools.choice != "none":
            if not self.renders_tools:
                raise ApiError(400, f"the chat template of model {self.model!r} does not "
                                    "render tools", param="tools")
            if constrained(tools):
                parser = functools.partial(constrained_parser, tools)
            elif self.tool_parser is None:
                raise ApiError(400, "no tool-call parser for this model's chat template: "
                                    "start the server with --tool-call-parser", param="tools")
            else:
                parser = self.tool_parser
        return RequestParsing(tools, parser, self.reasoning, self._end_text)

    def _end_text(self, token_id: int) -> str:
        """The text a stop token adds only because special tokens are kept ("" for a
        token that is not special: its text is in the output either way)."""
        if self.tokenizer.decode([token_id], skip_special_tokens=True):
            return ""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
