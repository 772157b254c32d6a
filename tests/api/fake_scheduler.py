"""A scripted stand-in for the scheduler process, run as a thread inside a test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.wire.api_input import ApiInput, BatchOut, CacheFlushed, Limits, ReqOut
from runtime.wire.ipc import PullQueue, PushQueue
from runtime.wire.lifecycle import Shutdown
from runtime.wire.request_output import FinishReason
from runtime.wire.scheduler_input import (
    AbortReq,
    FinishReq,
    FlushCache,
    GenerateReq,
    SchedulerInput,
)


class FakeScheduler:
    """Binds `sched_in`, connects to `api_in`, and answers every GenerateReq with the ids
    `script(req)` returns, `per_msg` ids per BatchOut, one BatchOut per step.

    It ends a request with STOP at a stop id, LENGTH at max_tokens, and STOP when the
    script runs out; it drops one silently on `FinishReq`; it answers `FlushCache` (refused
    while requests are active); `stall=True` accepts requests
    but never answers. While `hold` is an Event not yet set, a request gets its first step
    and then waits for it (a stream's first chunk arrives alone, however fast the rest
    would follow). Everything received is kept in `received`. First it sends
    `limits`, as the real one does at start-up (default: the model's context, capped by
    `cfg.kv_slots` if set).
    """

    def __init__(self, cfg: ServerConfig, script: Callable[[GenerateReq], list[int]], *,
                 per_msg: int = 3, step_s: float = 0.002, stall: bool = False,
                 cached_tokens: int = 0, limits: Limits | None = None) -> None:
        self.cfg = cfg
        self.limits = limits if limits is not None else default_limits(cfg)
        self.script = script
        self.per_msg = per_msg
        self.step_s = step_s
        self.stall = stall
        self.cached_tokens = cached_tokens
        self.received: list[object] = []
        self.error: str | None = None  # set: finish every request with ERROR
        self.hold: threading.Event | None = None  # set by a test: see the class docstring
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-scheduler", daemon=True)

    def __enter__(self) -> FakeScheduler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def of_type(self, typ: type) -> list:
        return [m for m in list(self.received) if isinstance(m, typ)]

    def wait_for(self, pred: Callable[[], bool], timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.005)
        return False

    def _run(self) -> None:
        ctx = zmq.Context()
        ctx.setsockopt(zmq.RECONNECT_IVL, 5)  # api_in may be bound after we connect
        inbox: PullQueue[SchedulerInput] = PullQueue(ctx, self.cfg.ipc("sched_in"),
                                                     SchedulerInput, bind=True)
        outbox: PushQueue[ApiInput] = PushQueue(ctx, self.cfg.ipc("api_in"))
        active: dict[str, tuple[GenerateReq, list[int], int]] = {}  # rid -> (req, ids, sent)
        outbox.put(self.limits)
        while not self._stop.is_set():
            first = inbox.get(timeout_ms=int(self.step_s * 1000) or 1)
            for msg in ([first] if first is not None else []) + inbox.drain():
                self.received.append(msg)
                if isinstance(msg, GenerateReq):
                    active[msg.rid] = (msg, self.script(msg), 0)
                elif isinstance(msg, AbortReq) and active.pop(msg.rid, None) is not None:
                    outbox.put(BatchOut([ReqOut(msg.rid, finish_reason=msg.reason)]))
                elif isinstance(msg, FinishReq):
                    active.pop(msg.rid, None)
                elif isinstance(msg, FlushCache):  # refused while requests run, as the real one
                    outbox.put(CacheFlushed(msg.token, not active, f"{len(active)} running"))
                elif isinstance(msg, Shutdown):
                    self._stop.set()
            ready = [rid for rid in list(active) if self._may_step(active[rid][2])]
            if not self.stall and ready:
                outbox.put(BatchOut([self._step(rid, active) for rid in ready]))
        inbox.close()
        outbox.close()
        ctx.term()

    def _may_step(self, sent: int) -> bool:
        hold = self.hold
        return hold is None or hold.is_set() or sent == 0

    def _step(self, rid: str, active: dict) -> ReqOut:
        req, ids, sent = active[rid]
        if self.error is not None:
            del active[rid]
            return ReqOut(rid, finish_reason=FinishReason.ERROR, error=self.error)
        new: list[int] = []
        finish = None
        while len(new) < self.per_msg and finish is None:
            if sent == len(ids):
                finish = FinishReason.STOP
                break
            new.append(ids[sent])
            sent += 1
            if new[-1] in req.stop_ids:
                finish = FinishReason.STOP
            elif sent == req.params.max_tokens:
                finish = FinishReason.LENGTH
        active[rid] = (req, ids, sent)
        if finish is not None:
            del active[rid]
        first = sent == len(new)
        return ReqOut(rid, new, [-0.5] * len(new), finish,
                      prompt_tokens=len(req.input_ids) if first else 0,
                      cached_tokens=self.cached_tokens if first else 0)


def default_limits(cfg: ServerConfig) -> Limits:
    """What a real scheduler would report for `cfg` on a roomy device."""
    model = resolve_model(cfg.model).max_context
    context = min(model, cfg.kv_slots) if cfg.kv_slots else model
    return Limits(max_context=context, max_req_input_len=context - 1,
                  max_running=cfg.max_running, kv_slots=cfg.kv_slots or 4 * context,
                  model_max_context=model)
