"""RequestTimings: a token that came alone (a BatchOut column) is timed as a one-token
ReqOut would be."""

from __future__ import annotations

from runtime.api.timing import RequestTimings
from runtime.wire.api_input import ReqOut
from runtime.wire.request_output import FinishReason


def test_column_tokens_are_timed_like_one_token_reqouts():
    results = []
    for column in (False, True):
        timings, records = RequestTimings(), []
        timings.listeners.append(records.append)
        timings.start("k", 10.0, "rid")
        timings.on_output(ReqOut("k", [1, 2], prompt_tokens=5, queue_time=0.5), 11.0)
        for i, now in enumerate((11.5, 12.5, 12.75)):
            if column:
                timings.on_token("k", now)
            else:
                timings.on_output(ReqOut("k", [3 + i]), now)
        timings.on_output(ReqOut("k", [8, 9], finish_reason=FinishReason.LENGTH), 13.75)
        timings.finish("k", FinishReason.LENGTH, 7, now=14.0)
        results.append((records, timings.generation_tokens, timings.prompt_tokens))
    assert results[0] == results[1]
    (record,), generated, prompt = results[1]
    assert (generated, prompt, record.rid, record.completion_tokens) == (7, 5, "rid", 7)
    assert (record.ttft, record.e2e, record.queue_time) == (1.0, 4.0, 0.5)
    # tokens that arrive together share the gap since the previous arrival
    assert record.itl == [0.0, 0.5, 1.0, 0.25, 0.5, 0.5]
