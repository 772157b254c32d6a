"""The output of a request whose `tool_choice` names a function: the call's arguments
object alone, generated under the function's parameters schema."""

from __future__ import annotations

from runtime.api.tools.parser import ToolParser


class NamedCallParser(ToolParser):
    """The output is the arguments of one call to `function`; text after it is content."""

    name = "named"

    def __init__(self, function: str) -> None:
        super().__init__()
        self._open_call("", function)

    def _step(self) -> bool:
        if self._call is not None:
            return self._feed_call() is not None
        self._content(self.text_in.take())
        return False
