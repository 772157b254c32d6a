"""`ThinkParser`: splits a reasoning model's output into its reasoning, between `<think>`
and `</think>`, and the answer after it, as the output streams.

`qwen3`: reasoning only when the output opens with `<think>` (with thinking turned off,
`chat_template_kwargs={"enable_thinking": false}`, the template closes an empty block in
the prompt and the output is all answer). `deepseek-r1`: its template opens the block
in the prompt, so the output is reasoning from its start (a `<think>` it writes anyway
is dropped) until `</think>`; one that never closes it is all reasoning.
Whitespace between `</think>` and the answer is dropped. The cursor never goes back: a
piece costs time in its own length (see `MarkerText`).
"""

from __future__ import annotations

from typing import ClassVar

from runtime.api.text_markers import MarkerText

OPEN, CLOSE = "<think>", "</think>"
_START, _THINK, _AFTER, _ANSWER = range(4)


class ThinkParser:
    """Feed output pieces; each gives back (reasoning, answer) text."""

    name: ClassVar[str]
    starts_thinking: ClassVar[bool]  # the prompt opened the block: output begins inside it

    def __init__(self) -> None:
        self._in = MarkerText()
        self._state = _START
        self._lead: list[str] = []  # whitespace before the output's first text

    def feed(self, text: str) -> tuple[str, str]:
        """Take the next piece of output; the reasoning and answer text it adds."""
        self._in.add(text)
        return self._run()

    def finish(self) -> tuple[str, str]:
        """The output ended: release what was held back."""
        self._in.final = True
        return self._run()

    def _run(self) -> tuple[str, str]:
        reasoning, answer = [], []
        src = self._in
        while src:
            if self._state == _START:
                self._lead.append(src.skip_space())
                opened = src.starts(OPEN)
                if opened is None or not src and not opened and not src.final:
                    break
                if not opened:  # the whitespace before the output's text is kept
                    src.buf = "".join(self._lead) + src.buf
                self._state = _THINK if opened or self.starts_thinking else _ANSWER
            elif self._state == _THINK:
                before, found = src.until(CLOSE)
                reasoning.append(before)
                if found is None:
                    break
                self._state = _AFTER
            elif self._state == _AFTER:
                src.skip_space()
                if src:
                    self._state = _ANSWER
            else:
                answer.append(src.take())
        return "".join(reasoning), "".join(answer)


class Qwen3Parser(ThinkParser):
    name = "qwen3"
    starts_thinking = False


class DeepSeekR1Parser(ThinkParser):
    name = "deepseek-r1"
    starts_thinking = True


REASONING_PARSERS: dict[str, type[ThinkParser]] = {
    p.name: p for p in (Qwen3Parser, DeepSeekR1Parser)}
