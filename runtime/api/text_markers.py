"""`MarkerText`: text that arrives in pieces, consumed from the front by looking for marker
strings (`<tool_call>`, `</think>`, ...) that a later piece may complete.

Only a suffix that could still grow into a marker is held back, so each piece costs time
in its own length and the markers' lengths, never in the length of the text so far.
"""

from __future__ import annotations

from collections.abc import Sequence

_WHITESPACE = " \t\r\n"


class MarkerText:
    """The unconsumed text of a stream. `final` (set when the stream ended) releases what
    was held back for a marker that can no longer complete."""

    def __init__(self) -> None:
        self.buf = ""
        self.final = False

    def add(self, text: str) -> None:
        self.buf += text

    def __bool__(self) -> bool:
        return bool(self.buf)

    def take(self, n: int | None = None) -> str:
        """Consume and return the first `n` characters (all by default)."""
        n = len(self.buf) if n is None else n
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def until(self, markers: str | Sequence[str]) -> tuple[str, str | None]:
        """Consume up to and including the earliest of `markers`: (the text before it, the
        marker); without one, consume all but what may start a marker: (that text, None)."""
        if isinstance(markers, str):
            markers = (markers,)
        best = None
        for m in markers:
            i = self.buf.find(m)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, m)
        if best is not None:
            before = self.buf[:best[0]]
            self.buf = self.buf[best[0] + len(best[1]):]
            return before, best[1]
        hold = 0 if self.final else max(_partial(self.buf, m) for m in markers)
        return self.take(len(self.buf) - hold), None

    def skip_space(self) -> str:
        """Consume leading whitespace; return it."""
        stripped = self.buf.lstrip(_WHITESPACE)
        return self.take(len(self.buf) - len(stripped))

    def starts(self, marker: str) -> bool | None:
        """Whether the text starts with `marker` (consumed if so); None while too little
        text has come to tell."""
        if self.buf.startswith(marker):
            self.take(len(marker))
            return True
        if marker.startswith(self.buf) and not self.final:
            return None
        return False


def _partial(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0
