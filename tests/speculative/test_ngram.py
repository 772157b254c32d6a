"""Prompt lookup drafts what followed the latest earlier occurrence of the suffix."""

from __future__ import annotations

import pytest

from runtime.scheduler.speculative.ngram import NgramDrafter
from runtime.scheduler.speculative.speculation import accepted_prefix


def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix():
    d = NgramDrafter(1, 3)
    seq = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert d.propose(seq, 3) == [4, 5, 9]  # "1 2 3" occurred at 0..2
    seq.append(4)
    assert d.propose(seq, 3) == [5, 9, 1]  # indexed incrementally as the sequence grows
    seq += [7, 3, 4]  # "3 4" now also ends at 12, but the latest earlier one ends at 10
    assert d.propose(seq, 2) == [7, 3]


def test_the_longest_suffix_wins_over_a_later_shorter_match():
    d = NgramDrafter(1, 2)
    # "5 6" occurred at 0..1 (then 7); a lone "6" occurred later, at 4 (then 8)
    assert d.propose([5, 6, 7, 0, 6, 8, 5, 6], 1) == [7]


def test_no_draft_without_an_earlier_occurrence_or_below_the_minimum_length():
    assert NgramDrafter(1, 3).propose([1, 2, 3], 4) == []
    assert NgramDrafter(2, 3).propose([1, 2, 7, 1], 4) == []  # only a 1-gram repeats
    assert NgramDrafter(1, 3).propose([1, 2, 7, 1], 4) == [2, 7, 1]  # cut at the end


@pytest.mark.parametrize("drafts, samples, want", [
    ([], [5], 0), ([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 9, 3, 4], 1),
    ([1, 2, 3], [0, 2, 3, 4], 0),
])
def test_accepted_prefix_counts_the_leading_confirmed_drafts(drafts, samples, want):
    assert accepted_prefix(drafts, samples) == want
