"""The Llama 3.x JSON format: the output is one or more call objects, `;`-separated,
with the arguments under `parameters`, optionally after `<|python_tag|>`; an output that
starts otherwise is text.

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
"""

from __future__ import annotations

from runtime.api.tools.parser import ToolParser

PYTHON_TAG = "<|python_tag|>"
_START, _SEP, _CALL, _REST = range(4)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    template_marker = PYTHON_TAG

    def _step(self) -> bool:
        src = self.text_in
        if self._state == _START:
            self._content(src.skip_space())  # held: dropped if a call follows
            tagged = src.starts(PYTHON_TAG)
            if tagged is None or not src and not tagged:
                return False
            self._state = _SEP if tagged or src.buf[0] == "{" else _REST
            return True
        if self._state == _SEP:
            src.skip_space()
            if not src:
                return False
            if src.buf[0] == ";":
                src.take(1)
            elif src.buf[0] == "{":
                self._open_call("")
                self._state = _CALL
            else:
                self._state = _REST
            return True
        if self._state == _CALL:
            ended = self._feed_call()
            if ended is not None:
                self._state = _SEP if ended else _REST
            return ended is not None
        self._content(src.take())
        return False
