"""`Call`: one OpenAI call in progress (its choices' outputs), and the responses built
from them: the whole response, or a stream's events, one choice's delta at a time.

Completions with `echo` get the prompt before each choice's text (in a stream, in its
first event); with `logprobs` too, the prompt's tokens and logprobs come first in the
choice's `logprobs` (see `logprobs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from runtime.api.openai.chat_output import ChatOutput
from runtime.api.openai.logprobs import (
    chat_logprobs,
    completion_logprobs,
    output_tokens,
    prompt_tokens,
)
from runtime.api.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatStreamChoice,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
)
from runtime.wire.request_output import RequestOutput


@dataclass
class Call:
    """One OpenAI call in progress: `len(prompts) * n` choices, each one request.

    `outputs[i]` is choice i's latest output: the whole of it when not streamed, its last
    delta in a stream (whose counters are totals all the same)."""

    id: str
    chat: bool
    model: str
    n: int
    logprobs: bool
    include_usage: bool
    token_text: Callable[[int], str]  # a token id's text, for logprobs
    created: int = field(default_factory=lambda: int(time.time()))
    outputs: list[RequestOutput] = field(default_factory=list)
    chars: list[int] = field(default_factory=list)  # each choice's streamed text length
    top: int = 0  # completions' logprobs=N: alternatives per token
    given: frozenset[str] = frozenset()  # the sampling fields the request set
    # with echo: per choice, its prompt's text and ids, until its first piece took them
    echo: list[tuple[str, list[int]] | None] = field(default_factory=list)
    # chat with tools or reasoning: per choice, the reader of its output
    readers: list[ChatOutput] = field(default_factory=list)

    def usage(self) -> Usage:
        # a prompt counts once however many choices it has (as OpenAI bills it)
        prompt = sum(o.prompt_tokens for o in self.outputs[::self.n])
        cached = sum(o.cached_tokens for o in self.outputs[::self.n])
        completion = sum(o.completion_tokens for o in self.outputs)
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion,
                     prompt_tokens_details={"cached_tokens": cached})

    def role_chunk(self) -> msgspec.Struct:
        """A chat stream's first event: the assistant's role, for every choice."""
        role = ChatDelta(role="assistant", content="")
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model,
            choices=[ChatStreamChoice(index=i, delta=role) for i in range(len(self.outputs))])

    def chunks(self, index: int, delta: RequestOutput) -> list[msgspec.Struct]:
        """The streamed events of one choice's delta: one, or (a chat with a reader) one
        per part, the finish reason and logprobs on the last."""
        if not self.chat:
            return [self._chunk(index, delta)]
        if self.readers:
            reader = self.readers[index]
            deltas, finish = reader.deltas(delta), reader.finish_reason(delta)
        else:
            deltas = [ChatDelta(content=delta.text) if delta.text or not delta.finished
                      else ChatDelta()]
            finish = delta.finish_reason
        logprobs = chat_logprobs(delta, self.token_text) if self.logprobs else None
        chunks = []
        for i, d in enumerate(deltas):
            last = i == len(deltas) - 1
            chunks.append(ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model,
                choices=[ChatStreamChoice(index=index, delta=d,
                                          logprobs=logprobs if last else None,
                                          finish_reason=finish if last else None)]))
        return chunks

    def _chunk(self, index: int, delta: RequestOutput) -> msgspec.Struct:
        """One streamed completions event, from one choice's delta."""
        # offsets run over the whole completion: this delta starts where the text so far ends
        text, logprobs = self._completion_text(index, delta, self.chars[index])
        self.chars[index] += len(text)
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model,
            choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                      finish_reason=delta.finish_reason)])

    def usage_chunk(self) -> msgspec.Struct:
        cls = ChatCompletionChunk if self.chat else CompletionResponse
        return cls(id=self.id, created=self.created, model=self.model, choices=[],
                   usage=self.usage())

    def response(self) -> msgspec.Struct:
        """The whole response, from every choice's whole output."""
        if self.chat:
            choices = []
            for i, o in enumerate(self.outputs):
                message, finish = self.readers[i].message(o) if self.readers else (
                    AssistantMessage(role="assistant", content=o.text), o.finish_reason)
                choices.append(ChatChoice(
                    index=i, message=message, finish_reason=finish,
                    logprobs=chat_logprobs(o, self.token_text) if self.logprobs else None))
            return ChatCompletionResponse(id=self.id, created=self.created, model=self.model,
                                          usage=self.usage(), choices=choices)
        choices = []
        for i, o in enumerate(self.outputs):
            text, logprobs = self._completion_text(i, o, 0)
            choices.append(CompletionChoice(index=i, text=text, logprobs=logprobs,
                                            finish_reason=o.finish_reason))
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  usage=self.usage(), choices=choices)

    def _completion_text(self, index: int, out: RequestOutput,
                         start: int) -> tuple[str, CompletionLogprobs | None]:
        """Choice `index`'s text and logprobs in `out` (a delta starting at offset `start`,
        or the whole output at 0): the echoed prompt first, in its first piece."""
        text, tokens, echo = out.text, [], None
        if self.echo:
            echo, self.echo[index] = self.echo[index], None
            if echo is not None:
                text = echo[0] + text
            if self.logprobs:
                tokens = prompt_tokens(out, echo[1][0] if echo is not None else None)
        if not self.logprobs:
            return text, None
        tokens += output_tokens(out)
        return text, completion_logprobs(tokens, self.token_text, start, self.top)
