"""`NgramDrafter`: prompt lookup, the draft proposer that needs no second model.

A sequence that repeats its own text (an edit of the prompt, a summary quoting it, code
that reuses names) often continues the way an earlier occurrence of its last few tokens
did. The drafter keeps, per n-gram length, the end of each n-gram's latest occurrence,
indexed incrementally as tokens arrive, so a proposal costs O(new tokens), never the
sequence's length.
"""

from __future__ import annotations


class NgramDrafter:
    """Drafts for one sequence: the tokens that followed the latest earlier occurrence of
    its last n tokens, for the longest n in [min_n, max_n] that occurred before."""

    def __init__(self, min_n: int, max_n: int) -> None:
        assert 1 <= min_n <= max_n, (min_n, max_n)
        self.min_n, self.max_n = min_n, max_n
        # per n: n-gram -> the position just past its latest indexed occurrence
        self._ends: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending at positions <= this are indexed

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` draft tokens to follow `tokens` (the sequence so far, which only
        grows between calls); empty when no suffix occurred before."""
        end = len(tokens)
        self._index(tokens, end - 1)  # the suffix itself must not match itself
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            at = self._ends[n].get(tuple(tokens[end - n:end]))
            if at is not None:
                return tokens[at:at + k]
        return []

    def _index(self, tokens: list[int], upto: int) -> None:
        """Record every n-gram ending at positions (self._indexed, upto]."""
        for stop in range(self._indexed + 1, upto + 1):
            for n, ends in self._ends.items():
                if stop >= n:
                    ends[tuple(tokens[stop - n:stop])] = stop
        self._indexed = max(self._indexed, upto)
