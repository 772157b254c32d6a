"""OpenAI-compatible response schemas (msgspec): completions and chat completions, whole
or as stream chunks, with their logprobs and usage."""

from __future__ import annotations

import msgspec

from runtime.api.tools.protocol import DeltaToolCall, ToolCallItem


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None  # {"cached_tokens": n}


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """Per token: its text, logprob (None for an echoed prompt's first token), offset in
    the choice's text, and with logprobs=N its N alternatives plus itself, by text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    text_offset: list[int]
    top_logprobs: list[dict[str, float] | None] | None = None


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class _Response(msgspec.Struct, kw_only=True):
    """What every response and stream chunk starts with."""

    id: str
    created: int  # Unix time, seconds
    model: str


class CompletionResponse(_Response, kw_only=True):
    """A completions response, or (object "text_completion", streamed) one of its chunks."""

    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: Usage | None = None


class TopLogprob(msgspec.Struct, kw_only=True):
    """A token by its text (and UTF-8 bytes), with its logprob."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob, kw_only=True):
    """A chat output token's logprob, with its most likely alternatives."""

    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[TokenLogprob]


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallItem] | None = None


class _ChatChoice(msgspec.Struct, kw_only=True):
    """What a chat choice says beside its message (whole) or its delta (streamed)."""

    index: int
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatChoice(_ChatChoice, kw_only=True):
    message: AssistantMessage


class ChatCompletionResponse(_Response, kw_only=True):
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(_ChatChoice, kw_only=True):
    delta: ChatDelta


class ChatCompletionChunk(_Response, kw_only=True):
    choices: list[ChatStreamChoice]
    object: str = "chat.completion.chunk"
    usage: Usage | None = None
