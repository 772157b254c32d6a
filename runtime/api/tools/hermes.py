"""The Hermes format (Hermes 2 Pro, Qwen2.5, Qwen3): each call a JSON object between
`<tool_call>` and `</tool_call>`, text around them.

    Let me look.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

from runtime.api.tools.parser import ToolParser

START, END = "<tool_call>", "</tool_call>"
_TEXT, _CALL, _AFTER = range(3)


class HermesParser(ToolParser):
    name = "hermes"
    template_marker = START

    def _step(self) -> bool:
        src = self.text_in
        if self._state == _TEXT:
            before, found = src.until(START)
            self._content(before)
            if found:
                self._open_call(START)
                self._state = _CALL
            return found is not None
        if self._state == _CALL:
            if self._feed_call() is None:
                return False
            self._state = _AFTER
            return True
        src.skip_space()  # after a call: its end marker, if the model wrote one
        closed = src.starts(END)
        if closed is None:
            return False
        self._state = _TEXT
        return True
