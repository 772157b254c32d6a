"""The DeepSeek-V3 format: its tool tokens around each call, the function's name after
the separator, the arguments in a JSON code fence.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

from runtime.api.tools.parser import ToolParser

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json", "```"
_TEXT, _NEXT, _TYPE, _NAME, _FENCE, _ARGS, _UNFENCE, _END = range(8)


class DeepSeekV3Parser(ToolParser):
    name = "deepseek_v3"
    template_marker = CALLS_BEGIN

    def __init__(self) -> None:
        super().__init__()
        self._head = ""  # the text of a call not yet opened: given back if it never is
        self._fn = ""

    def _give_back(self) -> None:
        self._content(self._head)
        self._head = ""

    def _step(self) -> bool:
        src, state = self.text_in, self._state
        if state == _TEXT:
            before, found = src.until(CALLS_BEGIN)
            self._content(before)
            if found:
                self._head, self._state = found, _NEXT
            return found is not None
        if state in (_NEXT, _FENCE, _UNFENCE, _END):
            self._head += src.skip_space()
            return self._expect()
        if state in (_TYPE, _NAME):
            before, found = src.until(SEP if state == _TYPE else "\n")
            self._head += before + (found or "")
            if state == _NAME:
                self._fn += before
            if found:
                self._state = _NAME if state == _TYPE else _FENCE
            return found is not None
        ended = self._feed_call()
        if ended is not None:
            self._state = _UNFENCE if ended else _TEXT
        return ended is not None

    def _expect(self) -> bool:
        """The marker expected next (some are optional); False while too little came."""
        src, state = self.text_in, self._state
        if state == _NEXT:
            began = src.starts(CALL_BEGIN)
            ended = src.starts(CALLS_END) if began is False else False
            if began is None or ended is None:
                return False
            if began:
                self._head += CALL_BEGIN
            self._state = _TYPE if began else _TEXT
            if not began:
                self._content(self._head if not ended else "")
                self._head = ""
            return True
        marker = {_FENCE: FENCE_OPEN, _UNFENCE: FENCE_CLOSE, _END: CALL_END}[state]
        found = src.starts(marker)
        if found is None:
            return False
        if state == _FENCE:
            self._head += marker if found else ""
            self._open_call(self._head, self._fn.strip())
            self._head, self._fn, self._state = "", "", _ARGS
        else:
            self._state = _END if state == _UNFENCE else _NEXT
        return True
