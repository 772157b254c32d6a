"""`ChatOutput`: one chat choice's output read as OpenAI's message parts: reasoning,
content and tool calls, streamed (deltas) or whole (a message)."""

from __future__ import annotations

from collections.abc import Callable

from runtime.api.openai.responses import AssistantMessage, ChatDelta
from runtime.api.reasoning.think import ThinkParser
from runtime.api.tools.parser import CallDelta, ToolParser
from runtime.api.tools.protocol import DeltaFunction, DeltaToolCall, FunctionCall, ToolCallItem
from runtime.wire.request_output import FinishReason, RequestOutput

TOOL_CALLS = "tool_calls"  # the finish reason of an answer that made calls


class ChatOutput:
    """Feeds one choice's output through its reasoning parser, then its tool parser (both
    optional). `end_text(id)`: the text of a stop token, cut off the output's end (when
    special tokens are kept for the tool parser); `parallel` false keeps the first call."""

    def __init__(self, tools: ToolParser | None, reasoning: ThinkParser | None,
                 parallel: bool = True, end_text: Callable[[int], str] | None = None) -> None:
        self.tools = tools
        self.reasoning = reasoning
        self.parallel = parallel
        self._end_text = end_text
        self._called = False

    def deltas(self, out: RequestOutput) -> list[ChatDelta]:
        """The stream's next deltas, from one output delta: text first, then each call's
        pieces, a call's first piece (id, type, name, arguments "") a delta of its own."""
        reasoning, content, calls = self._feed(out)
        first = ChatDelta(reasoning_content=reasoning or None, content=content or None)
        deltas = [first]
        for c in calls:
            last = deltas[-1].tool_calls
            if c.name is not None:
                fn = DeltaFunction(name=c.name, arguments="")
                deltas.append(ChatDelta(tool_calls=[DeltaToolCall(
                    index=c.index, id=c.id, type="function", function=fn)]))
            elif last and last[0].index == c.index and last[0].id is None:
                last[0].function.arguments += c.arguments
            else:
                deltas.append(ChatDelta(tool_calls=[DeltaToolCall(
                    index=c.index, function=DeltaFunction(arguments=c.arguments))]))
        if first.reasoning_content is None and first.content is None:
            if len(deltas) > 1:
                deltas.pop(0)
            elif not out.finished:
                first.content = ""  # an empty piece still says the choice goes on
        return deltas

    def finish_reason(self, out: RequestOutput) -> str | None:
        """A stream's finish reason: `tool_calls` for an answer that ended making calls."""
        if out.finish_reason == FinishReason.STOP and self._called:
            return TOOL_CALLS
        return out.finish_reason

    def message(self, out: RequestOutput) -> tuple[AssistantMessage, str | None]:
        """The whole answer and its finish reason, from the whole output."""
        reasoning, content, _ = self._feed(out)
        calls = []
        if self.tools is not None:
            content = self.tools.text
            kept = self.tools.calls if self.parallel else self.tools.calls[:1]
            calls = [ToolCallItem(id=c.id, function=FunctionCall(name=c.name,
                                                                 arguments=c.arguments))
                     for c in kept]
        finish = out.finish_reason
        if calls and finish == FinishReason.STOP:
            finish = TOOL_CALLS
        empty = None if calls or self.reasoning is not None else ""
        return AssistantMessage(role="assistant", content=content or empty,
                                reasoning_content=reasoning or None,
                                tool_calls=calls or None), finish

    def _feed(self, out: RequestOutput) -> tuple[str, str, list[CallDelta]]:
        """(reasoning, content, call pieces) that output piece `out` adds."""
        text = out.text
        if out.finished and self._end_text is not None and isinstance(out.matched_stop, int):
            end = self._end_text(out.matched_stop)
            if end and text.endswith(end):
                text = text[:-len(end)]
        reasoning, answer = "", text
        if self.reasoning is not None:
            reasoning, answer = self.reasoning.feed(text)
            if out.finished:
                more_reasoning, more_answer = self.reasoning.finish()
                reasoning, answer = reasoning + more_reasoning, answer + more_answer
        if self.tools is None:
            return reasoning, answer, []
        parsed = self.tools.feed(answer)
        content, calls = parsed.content, parsed.calls
        if out.finished:
            rest = self.tools.finish()
            content, calls = content + rest.content, calls + rest.calls
        if not self.parallel:
            calls = [c for c in calls if c.index == 0]
        self._called = self._called or bool(calls)
        return reasoning, content, calls
