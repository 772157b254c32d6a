"""Apply one `BatchOut` to the requests in flight, with one batched detokenize.

The receive loop calls `apply_batch` once per scheduler step: the new ids of every request
in the batch are detokenized together (`detokenize_batch`), then each request's
`ReqState` takes its `ReqOut` and wakes its consumer once.
"""

from __future__ import annotations

import logging
import time

from runtime.api.detokenize_batch import BatchDecoder, detokenize_batch
from runtime.api.errors import RequestFailed
from runtime.api.req_state import ReqState
from runtime.api.timing import RequestTimings
from runtime.messages import AbortReq, BatchOut, FinishReason, FinishReq

log = logging.getLogger(__name__)


def apply_batch(batch: BatchOut, reqs: dict[str, ReqState], decoder: BatchDecoder | None,
                timings: RequestTimings) -> list[AbortReq | FinishReq]:
    """Feed each request in flight its ReqOut; return what the scheduler must be told: a
    `FinishReq` for a request a stop string ended here, an `AbortReq` with reason ERROR
    for one whose output could not be detokenized."""
    found = [(out, state) for out in batch.outs if (state := reqs.get(out.rid)) is not None]
    texts: dict[int, str | Exception] = {}  # index in `found` -> its batched detokenize
    if decoder is not None:
        seen: set[str] = set()
        todo = []
        for i, (out, state) in enumerate(found):
            # a request twice in one batch: its later outputs are detokenized in order, alone
            if state.detok is not None and not state.ended and out.rid not in seen:
                seen.add(out.rid)
                todo.append(i)
        done = detokenize_batch(decoder, [(found[i][1].detok, found[i][0].token_ids)
                                          for i in todo])
        texts = dict(zip(todo, done))
    ends: list[AbortReq | FinishReq] = []
    now = time.monotonic()  # every output of the batch arrived together
    for i, (out, state) in enumerate(found):
        timings.on_output(out, now)
        text = texts.get(i)
        try:
            if isinstance(text, Exception):
                raise text
            if state.on_output(out, text):
                ends.append(FinishReq(out.rid))
        except Exception as e:  # e.g. a token id the tokenizer cannot decode
            log.exception("request %s failed while detokenizing", out.rid)
            state.fail(RequestFailed(f"detokenizing the output failed: {e!r}"))
            if not state.scheduler_done:
                ends.append(AbortReq(out.rid, reason=FinishReason.ERROR))
                state.scheduler_done = True
    return ends
