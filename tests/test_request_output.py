"""`RequestOutput`: a stream's deltas join into the whole output, alternatives included."""

from __future__ import annotations

from runtime.wire.request_output import RequestOutput


def test_join_keeps_each_tokens_alternatives():
    first = RequestOutput(rid="r", text="a", token_ids=[5], logprobs=[-0.1],
                          top_ids=[5, 6], top_logprobs=[-0.1, -2.0],
                          input_logprobs=[-1.0], input_token_ids=[9],
                          input_top_ids=[9, 8], input_top_logprobs=[-1.0, -1.5])
    second = RequestOutput(rid="r", text="b", token_ids=[7, 3], logprobs=[-0.2, -0.3],
                           top_ids=[7, 1, 3, 4], top_logprobs=[-0.2, -1.0, -0.3, -3.0],
                           completion_tokens=3)
    whole = RequestOutput.join([first, second])
    assert whole.token_ids == [5, 7, 3] and whole.text == "ab"
    assert [whole.top(i) for i in range(3)] == [[(5, -0.1), (6, -2.0)], [(7, -0.2), (1, -1.0)],
                                                [(3, -0.3), (4, -3.0)]]
    assert whole.top(0, prompt=True) == [(9, -1.0), (8, -1.5)]
    assert RequestOutput(rid="r", token_ids=[1]).top(0) == []  # none asked
