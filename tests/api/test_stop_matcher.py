"""StopMatcher: the same stop as a scan of every stop string, at a cost per character that
does not grow with their number; and the request-level bounds on stop strings."""

from __future__ import annotations

import random
import sys

import pytest

from runtime.api.detokenize import IncrementalDetokenizer
from runtime.api.stop_matcher import StopMatcher
from runtime.wire.errors import InvalidRequest
from runtime.wire.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams


def scan_every_stop(before: str, text: str, stops: list[str]) -> tuple[int, str] | None:
    """The earliest-starting stop string ending in `text` (ties: list order), by searching
    for each one."""
    whole, best = before + text, None
    for s in stops:
        i = whole.find(s, max(0, len(before) - len(s) + 1))
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    return None if best is None else (best[0] - len(before), best[1])


@pytest.mark.parametrize("alphabet", ["ab", "abc", "aé中😀"])
def test_same_stop_as_scanning_every_stop_string(alphabet):
    rng = random.Random(len(alphabet))
    for _ in range(1500):
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5)))
            for _ in range(rng.randint(1, 6))
        ]
        matcher, before = StopMatcher(stops), ""
        for _ in range(12):
            text = "".join(rng.choice(alphabet + "x") for _ in range(rng.randint(0, 6)))
            found = matcher.feed(text)
            assert found == scan_every_stop(before, text, stops), (stops, before, text)
            if found is not None:
                break
            before += text


def test_earliest_start_wins_then_list_order():
    assert StopMatcher(["bc", "abcd"]).feed("abcd") == (0, "abcd")
    assert StopMatcher(["abc", "ab"]).feed("xabc") == (1, "abc")
    assert StopMatcher(["ab", "abc"]).feed("xabc") == (1, "ab")
    m = StopMatcher(["STOP"])
    assert m.feed("ST") is None and m.feed("OP!") == (-2, "STOP")


def lines_run_by_feed(stops: list[str], text: str) -> int:
    """How many lines of `StopMatcher.feed` run to feed `text` three characters at a time
    (an operation count: the same on any machine)."""
    matcher, count = StopMatcher(stops), [0]

    def local(frame, event, arg):
        count[0] += event == "line"
        return local

    def trace(frame, event, arg):
        return local if frame.f_code is StopMatcher.feed.__code__ else None

    sys.settrace(trace)
    try:
        for i in range(0, len(text), 3):
            matcher.feed(text[i : i + 3])
    finally:
        sys.settrace(None)
    return count[0]


def test_cost_per_character_does_not_grow_with_the_number_of_stop_strings():
    rng = random.Random(0)
    text = "".join(rng.choice("ab") for _ in range(3000))
    one = lines_run_by_feed(["zzz"], text)
    # 1000 stop strings sharing long prefixes with the text, none matching it
    many = lines_run_by_feed(
        ["".join(rng.choice("ab") for _ in range(20)) + "z" for _ in range(1000)], text
    )
    assert many < 1.5 * one
    assert lines_run_by_feed(["a" * 500 + "b"], "a" * 3000) < 1.5 * one  # a long near-miss


def test_detokenizer_stops_at_the_earliest_of_many_stop_strings(tok):
    text = "The answer is 42. STOPWORD and more text after it."
    ids = tok.encode(text)
    stops = [f"never{i}" for i in range(MAX_STOP_STRINGS - 2)] + ["and more", "42. ST"]
    d = IncrementalDetokenizer(tok, [], True, stops)
    shown = "".join(d.add([t]) for t in ids) + d.flush()
    assert shown == "The answer is " and d.stop_str == "42. ST"


def test_stop_strings_are_bounded_in_number_and_length():
    SamplingParams(stop=["x"] * MAX_STOP_STRINGS).validate()
    SamplingParams(stop=["x" * (MAX_STOP_CHARS // 2)] * 2).validate()
    with pytest.raises(InvalidRequest, match=f"at most {MAX_STOP_STRINGS} stop strings"):
        SamplingParams(stop=["x"] * 1_000_000).validate()
    with pytest.raises(InvalidRequest, match=f"at most {MAX_STOP_CHARS} characters"):
        SamplingParams(stop=["x" * MAX_STOP_CHARS, "y"]).validate()
