"""`ToolParser`: finds tool calls in a model's output text as it streams, one parser per
output format (`hermes`, `llama3_json`, `mistral`, `deepseek_v3`, and the JSON the
constrained `tool_choice` modes generate).

A parser is fed the output in pieces and answers each with a `Parsed`: the text outside
the calls (content) and `CallDelta`s, the first of a call naming it, the later ones
carrying its arguments' text, as OpenAI streams them. The whole output fed at once gives
the same content and calls as fed token by token. The cursor never goes back: text is
held only while it may still start a marker, so a piece costs time in its own length.

A call is kept (`calls`) once its JSON is complete and well formed. One that never
closes, or is malformed, is text: given back as content if it was not yet announced,
else (its name already streamed) kept in `text` only, which the whole, non-streamed
answer uses as its content.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from runtime.api.text_markers import MarkerText
from runtime.api.tools.json_call import JsonCall

_SPACE = " \t\r\n"


@dataclass
class CallDelta:
    """A streamed piece of tool call `index`: its first piece has `id` and `name` (and
    arguments ""), later ones the next piece of its arguments' JSON text."""

    index: int
    arguments: str = ""
    name: str | None = None
    id: str | None = None


@dataclass
class ToolCall:
    """A complete call: its arguments are the JSON object text the model wrote."""

    id: str
    name: str
    arguments: str


@dataclass
class Parsed:
    """What one piece of output added: content text and call pieces."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser:
    """The shared machinery; a format implements `_step`, which consumes the front of
    `self.text_in` (a `MarkerText`) and says whether it made progress."""

    name: ClassVar[str]
    # text of a chat template written for this format (how `auto` recognises it)
    template_marker: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.text_in = MarkerText()
        self.calls: list[ToolCall] = []
        self._text: list[str] = []  # the whole answer's content, in order
        self._space: list[str] = []  # whitespace held until text follows (dropped by calls)
        self._out = Parsed()
        self._call: JsonCall | None = None
        self._opening = ""  # the text that opened the current call
        self._announced: CallDelta | None = None
        self._count = 0  # calls announced so far: the next one's index
        self._state = 0  # where a format's `_step` is: each format numbers its states from 0

    @property
    def text(self) -> str:
        """The content of the whole answer: text outside the calls kept, including the
        text of announced calls that never closed or were malformed."""
        return "".join(self._text)

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output; what it adds."""
        self.text_in.add(text)
        while self.text_in and self._step():
            pass
        return self._take()

    def finish(self) -> Parsed:
        """The output ended: release what was held, give back a call left open."""
        self.text_in.final = True
        while self.text_in and self._step():
            pass
        self._give_back()
        if self._call is not None:
            self._call.done = self._call.failed = True
            self._close_call()
        self._content(self.text_in.take())
        if not self.calls:
            self._content_now("".join(self._space))
        self._space = []
        return self._take()

    def _step(self) -> bool:
        raise NotImplementedError

    def _give_back(self) -> None:
        """At the end: text a format held for a call that never opened goes to content."""

    # ------------------------------------------------------------ helpers for formats
    def _content(self, text: str) -> None:
        """Text outside the calls; whitespace at its end waits to see what follows."""
        kept = text.rstrip(_SPACE)
        if kept:
            self._content_now("".join(self._space) + kept)
            self._space = []
        if len(kept) < len(text):
            self._space.append(text[len(kept):])

    def _content_now(self, text: str) -> None:
        if text:
            self._out.content += text
            self._text.append(text)

    def _open_call(self, opening: str, name: str | None = None) -> None:
        """A call starts (after `opening`, the text that announced it)."""
        self._call, self._opening, self._announced = JsonCall(name), opening, None

    def _feed_call(self) -> bool | None:
        """Feed the open call what has come; once it ended, whether it was kept (a call)
        or given back (text); None while it goes on."""
        call = self._call
        self.text_in.take(call.feed(self.text_in.buf))
        self._announce()
        return self._close_call() if call.done else None

    def _announce(self) -> None:
        call = self._call
        if self._announced is None and call.name and not call.failed:
            self._announced = CallDelta(self._count, "", call.name, new_call_id())
            self._count += 1
            self._opening, self._space = "".join(self._space) + self._opening, []
            self._out.calls.append(self._announced)
        if self._announced is not None:
            piece = call.arguments()
            if piece:
                self._out.calls.append(CallDelta(self._announced.index, piece))

    def _close_call(self) -> bool:
        call, self._call = self._call, None
        found = call.result()
        if found is not None:
            self.calls.append(ToolCall(self._announced.id, *found))
            self._space = []
        elif self._announced is not None:  # streamed already: text of the whole answer
            self._text.append(self._opening + call.raw)
        else:
            self._content(self._opening + call.raw)
        self._announced = None
        return found is not None

    def _take(self) -> Parsed:
        out, self._out = self._out, Parsed()
        return out
