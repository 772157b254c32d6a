"""`StopMatcher`: finds stop strings in a stream of text, at a cost per character that
does not grow with the number of stop strings.

An Aho-Corasick automaton over the stop strings: a trie whose nodes also link to the
node of their longest proper suffix in the trie (`fail`), so one state summarises all the
text fed so far and each character moves it once (amortized). Every node knows the
longest stop string that ends there, which is the match starting earliest among those
ending at that character.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

_ROOT = 0


class StopMatcher:
    """Feeds text and reports the stop string that starts earliest in it.

    `feed` returns, among the matches ending inside the text it was given, the one that
    starts earliest (ties: the first in `stops` order), as (start offset into that text,
    possibly negative for a match that began in earlier text, the stop string); the
    state carries over, so matches across `feed` calls are found.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = list(stops)
        self._children: list[dict[str, int]] = [{}]
        self._fail: list[int] = [_ROOT]
        # per node: (length, index in `stops`) of the longest stop string ending here
        self._out: list[tuple[int, int] | None] = [None]
        for index, stop in enumerate(self._stops):
            self._insert(stop, index)
        self._link()
        self._state = _ROOT

    def feed(self, text: str) -> tuple[int, str] | None:
        """Advance over `text`; the earliest-starting stop string that ends in it, if any."""
        children, fail, out = self._children, self._fail, self._out
        state = self._state
        best: tuple[int, int] | None = None  # (start, index)
        for end, ch in enumerate(text):
            while state != _ROOT and ch not in children[state]:
                state = fail[state]
            state = children[state].get(ch, _ROOT)
            match = out[state]
            if match is not None:
                found = (end - match[0] + 1, match[1])
                if best is None or found < best:
                    best = found
        self._state = state
        return None if best is None else (best[0], self._stops[best[1]])

    def _insert(self, stop: str, index: int) -> None:
        node = _ROOT
        for ch in stop:
            nxt = self._children[node].get(ch)
            if nxt is None:
                nxt = len(self._children)
                self._children[node][ch] = nxt
                self._children.append({})
                self._fail.append(_ROOT)
                self._out.append(None)
            node = nxt
        if self._out[node] is None:  # a repeated stop string keeps its first index
            self._out[node] = (len(stop), index)

    def _link(self) -> None:
        """Set each node's suffix link and inherit the longest match along it (BFS)."""
        queue = deque(self._children[_ROOT].values())
        while queue:
            node = queue.popleft()
            if self._out[node] is None:
                self._out[node] = self._out[self._fail[node]]
            for ch, child in self._children[node].items():
                f = self._fail[node]
                while f != _ROOT and ch not in self._children[f]:
                    f = self._fail[f]
                self._fail[child] = self._children[f].get(ch, _ROOT)
                queue.append(child)
