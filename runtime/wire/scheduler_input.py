"""api -> scheduler: tokenized requests and the api's control records (`SchedulerInput`)."""

from __future__ import annotations

from runtime.wire.lifecycle import Shutdown
from runtime.wire.record import WireRecord
from runtime.wire.request_output import FinishReason
from runtime.wire.sampling import SamplingParams


class GenerateReq(WireRecord):
    """A tokenized request. `stop_ids` already includes EOS unless ignore_eos."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    stop_ids: list[int] = []


class AbortReq(WireRecord):
    """End a request early: its client is gone or aborted it (ABORT), or the api failed
    it (ERROR, its KV is not cached). The scheduler answers with that finish reason."""

    rid: str
    reason: FinishReason = FinishReason.ABORT


class FinishReq(WireRecord):
    """The api finished a request itself (a stop string matched; its client already has
    the whole output): the scheduler ends it as a normal stop and answers nothing."""

    rid: str


class GetStats(WireRecord):
    """Ask the scheduler for a SchedulerStats snapshot (answered on the api channel)."""

    token: int = 0


class FlushCache(WireRecord):
    """Drop every cached prefix that no request holds (answered with `CacheFlushed`).
    Refused while requests wait or run; done once the batches in flight completed."""

    token: int = 0


SchedulerInput = GenerateReq | AbortReq | FinishReq | GetStats | Shutdown | FlushCache
