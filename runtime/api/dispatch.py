"""Apply one `BatchOut` to the requests in flight.

The receive loop calls `apply_batch` once per scheduler step: first the batch's columns
(requests whose only news is one token: the bulk of a decode step), then its `ReqOut`s.
Each request's `ReqState` detokenizes its new ids and wakes its consumer when it has
something to take.
"""

from __future__ import annotations

import logging
import time

from runtime.api.req_state import ReqState
from runtime.api.timing import RequestTimings
from runtime.wire.api_input import BatchOut
from runtime.wire.errors import RequestFailed
from runtime.wire.request_output import FinishReason
from runtime.wire.scheduler_input import AbortReq, FinishReq

log = logging.getLogger(__name__)


def apply_batch(batch: BatchOut, reqs: dict[str, ReqState],
                timings: RequestTimings) -> list[AbortReq | FinishReq]:
    """Feed each request in flight its output; return what the scheduler must be told: a
    `FinishReq` for a request a stop string ended here, an `AbortReq` with reason ERROR
    for one whose output could not be detokenized."""
    ends: list[AbortReq | FinishReq] = []
    now = time.monotonic()  # every output of the batch arrived together
    for key, token_id in zip(batch.rids, batch.next_ids):
        state = reqs.get(key)
        if state is None:
            continue
        timings.on_token(key, now)
        try:
            if state.on_token(token_id):
                ends.append(FinishReq(key))
        except Exception as e:  # e.g. a token id the tokenizer cannot decode
            _failed(state, key, e, ends)
    for out in batch.outs:
        state = reqs.get(out.rid)
        if state is None:
            continue
        timings.on_output(out, now)
        try:
            if state.on_output(out):
                ends.append(FinishReq(out.rid))
        except Exception as e:
            _failed(state, out.rid, e, ends)
    return ends


def _failed(state: ReqState, key: str, error: Exception,
            ends: list[AbortReq | FinishReq]) -> None:
    """Fail a request whose output could not be detokenized; the scheduler aborts it."""
    log.exception("request %s failed while detokenizing", key)
    state.fail(RequestFailed(f"detokenizing the output failed: {error!r}"))
    if not state.scheduler_done:
        ends.append(AbortReq(key, reason=FinishReason.ERROR))
        state.scheduler_done = True
