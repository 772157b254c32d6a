"""`Outbox`: what the scheduler streams to the api, batched per loop turn.

Each step's new tokens become ReqOuts, except the common case of one plain token for a
request whose header went out already: that goes into two columns (rids, ids) of the
BatchOut, so a decode step of a large batch costs one small message, not one per request.
"""

from __future__ import annotations

from runtime.scheduler.req import Req
from runtime.wire.api_input import BatchOut, ReqOut
from runtime.wire.request_output import FinishReason


class Outbox:
    """The api's pending outputs; the scheduler emits into it, the loop takes batches."""

    def __init__(self) -> None:
        # what the api gets next (`take_batch`): ReqOuts, the rids they are for, and the
        # one-token outputs as columns (see BatchOut)
        self.outbox: list[ReqOut] = []
        self._outbox_rids: set[str] = set()
        self.out_rids: list[str] = []
        self.out_ids: list[int] = []

    def _emit(self, req: Req, error: str | None = None) -> None:
        reason = req.finish_reason if req.finished and not req.silent_finish else None
        if (error is None and reason is None and req.sent_header
                and len(req.output_ids) == req.sent + 1 and not req.params.logprobs
                and not req.params.top_logprobs and len(req.input_logprobs) == req.sent_input
                and req.rid not in self._outbox_rids):  # one plain token: a column entry
            req.sent += 1
            self.out_rids.append(req.rid)
            self.out_ids.append(req.output_ids[-1])
            return
        new = req.output_ids[req.sent:]
        lps = req.logprobs[req.sent:] if req.params.logprobs else []
        k = req.params.top_logprobs
        top_ids, top_lps = req.top_ids[req.sent * k:], req.top_logprobs[req.sent * k:]
        input_top_ids = req.input_top_ids[req.sent_input * k:]
        input_top_lps = req.input_top_logprobs[req.sent_input * k:]
        req.sent = len(req.output_ids)
        input_lps = req.input_logprobs[req.sent_input:]
        req.sent_input = len(req.input_logprobs)
        if not new and not input_lps and reason is None and req.sent_header:
            return
        out = ReqOut(rid=req.rid, token_ids=new, logprobs=lps, finish_reason=reason,
                     error=error, input_logprobs=input_lps, top_ids=top_ids,
                     top_logprobs=top_lps, input_top_ids=input_top_ids,
                     input_top_logprobs=input_top_lps)
        if not req.sent_header:
            out.prompt_tokens, out.cached_tokens = len(req.prompt_ids), req.cached_len
            if req.scheduled_at is not None:
                out.queue_time = req.scheduled_at - req.arrival
            req.sent_header = True
        self._append(out)

    def _emit_error(self, req: Req, message: str) -> None:
        self._append(ReqOut(rid=req.rid, finish_reason=FinishReason.ERROR, error=message))

    def _append(self, out: ReqOut) -> None:
        self.outbox.append(out)
        self._outbox_rids.add(out.rid)  # its later outputs follow it in `outbox`

    def take_batch(self) -> BatchOut | None:
        """What the api must apply since the last take, or None if nothing."""
        if not self.outbox and not self.out_rids:
            return None
        batch = BatchOut(self.outbox, self.out_rids, self.out_ids)
        self.outbox, self.out_rids, self.out_ids = [], [], []
        self._outbox_rids.clear()
        return batch

    def take_outputs(self) -> list[ReqOut]:
        """`take_batch` as one ReqOut per output, in order (for in-process drivers)."""
        batch = self.take_batch()
        return [] if batch is None else batch.expanded()
