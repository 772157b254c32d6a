"""`Release`: the end of a request, and its KV given back once nothing reads it.

A request ends by `abort` or `finish` (from the api), or in the scheduler (its last
token, an error). A waiting one holds no KV and goes at once. A running one leaves
`running` for `deferred`: a batch still in flight may read its KV, so the KV is released
(cached, unless the request failed) only once every batch it was in has completed
(`completed_batch_id`).
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.scheduler.grammar_gate import GrammarGate
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.lora_slots import LoraSlots
from runtime.scheduler.req import Req, ReqStatus
from runtime.wire.request_output import FinishReason


class Release:
    """The ending and delayed KV release part of `Scheduler`, over its queues."""

    # the scheduler's (`Scheduler.__init__`, `Outbox`)
    kv: KVManager
    waiting: list[Req]
    running: list[Req]
    reqs: dict[str, Req]
    grammars: GrammarGate
    loras: LoraSlots
    _emit: Callable[..., None]

    def __init__(self) -> None:
        self.deferred: list[Req] = []  # finished, KV still read by a batch in flight
        self.completed_batch_id = -1

    def abort(self, rid: str, reason: FinishReason = FinishReason.ABORT) -> None:
        """End a request now with `reason` (ABORT, or ERROR: its KV is not cached); the
        api gets that finish reason."""
        self._end(rid, reason, silent=False)

    def finish(self, rid: str) -> None:
        """End a request the api finished itself (a stop string matched) as a normal stop;
        the api, which already answered its client, gets no finish reason."""
        self._end(rid, FinishReason.STOP, silent=True)

    def _end(self, rid: str, reason: FinishReason, silent: bool) -> None:
        req = self.reqs.get(rid)
        if req is None or req.finished:
            return
        if req.status is ReqStatus.WAITING:
            if not self.grammars.release(req):
                self.waiting.remove(req)
            if req.row is not None:  # never the case: waiting requests hold no KV
                self.kv.release(req, cache=False)
            self.kv.forget(req)  # but a swapped-out one holds host slots
            req.finish(reason, silent=silent)
            self._emit(req)
            self._drop(req)
            return
        req.finish(reason, silent=silent)
        self._emit(req)
        self._finish_running(req)

    def _finish_running(self, req: Req) -> None:
        if req in self.running:
            self.running.remove(req)
        self.deferred.append(req)
        self._release_deferred()

    def _release_deferred(self) -> None:
        keep = []
        for req in self.deferred:
            if req.last_batch_id <= self.completed_batch_id:
                if req.draft_kv_owed:  # a draft model never wrote its last position's KV
                    self.kv.truncate(req, req.kv_len - 1)
                    req.draft_kv_owed = False
                # cache only KV that was surely written: never after a failed batch
                ok = req.finish_reason != FinishReason.ERROR and 0 < req.kv_len <= req.known_len
                self.kv.release(req, cache=ok)
                self.loras.release(req)
                req.row = None
                self._drop(req)
            else:
                keep.append(req)
        self.deferred = keep

    def _drop(self, req: Req) -> None:
        self.reqs.pop(req.rid, None)
