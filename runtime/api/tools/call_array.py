"""Calls written as a JSON array of call objects, `[{"name": ..., "arguments": {...}},
...]`: the Mistral format after its `[TOOL_CALLS]` marker, and the whole output of a
request whose `tool_choice` is `required` (generated under a JSON schema, no marker)."""

from __future__ import annotations

from runtime.api.tools.parser import ToolParser

_TEXT, _OPEN, _ITEM, _CALL, _REST = range(5)


class CallArrayParser(ToolParser):
    """The output is a JSON array of calls (`tool_choice` required); text after it, or
    instead of it, is content."""

    name = "json_array"
    marker: str | None = None  # the text before the array, in a format that has one

    def __init__(self) -> None:
        super().__init__()
        self._state = _OPEN if self.marker is None else _TEXT
        self._after = _REST if self.marker is None else _TEXT  # where the array leads
        self._lead = ""  # the text since the marker or the last call: a call's opening

    def _step(self) -> bool:
        src = self.text_in
        if self._state == _TEXT:
            before, found = src.until(self.marker)
            self._content(before)
            if found:
                self._state, self._lead = _OPEN, found
            return found is not None
        if self._state == _OPEN:
            self._lead += src.skip_space()
            if not src:
                return False
            if src.buf[0] == "[":
                self._lead += src.take(1)
                self._state = _ITEM
            else:  # not an array after all: text
                self._content(self._lead)
                self._lead, self._state = "", self._after
            return True
        if self._state == _ITEM:
            self._lead += src.skip_space()
            if not src:
                return False
            if src.buf[0] in ",]":
                self._lead += src.take(1)
                if self._lead.endswith("]"):
                    self._lead, self._state = "", self._after
                return True
            self._open_call(self._lead)
            self._lead = ""
            self._state = _CALL
            return True
        if self._state == _CALL:
            ended = self._feed_call()
            if ended is not None:
                self._state = _ITEM if ended else self._after
            return ended is not None
        self._content(src.take())
        return False

