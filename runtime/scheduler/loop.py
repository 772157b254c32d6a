"""The scheduler process: requests in, BatchPlans to the worker, token streams to the api.

With overlap, up to two batches are in flight: while the worker runs batch N the loop
has already planned and sent N+1 (its decode inputs refer to N's samples by placeholder),
and only then waits for N's result. Without overlap the same loop keeps one in flight.
"""

from __future__ import annotations

import os
import sys

import zmq

from runtime.config import ServerConfig
from runtime.ipc import FanOutQueue, PullQueue, PushQueue
from runtime.messages import (
    AbortReq,
    BatchOut,
    GenerateReq,
    GetStats,
    Limits,
    Ready,
    SchedulerInput,
    SchedulerStats,
    Shutdown,
    StepResult,
    WorkerFailed,
    WorkerOutput,
    WorkerReady,
)
from runtime.model_config import resolve_model
from runtime.procutil import error_text, setup_logging
from runtime.scheduler.contiguous_kv import ContiguousKV
from runtime.scheduler.dynamic_kv import DynamicPagedKV
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.paged_kv import PagedKV
from runtime.scheduler.policy import PrefillAdder, preempt_order
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.token_kv import TokenKV

CHECK_INVARIANTS = os.environ.get("SLUICE_CHECK_INVARIANTS", "0") == "1"


def build_kv(cfg: ServerConfig, ready: WorkerReady, max_context: int) -> KVManager:
    """The KV manager of `cfg.kv` over the worker's slots (every layout uses the same pool)."""
    if cfg.kv == "contiguous":
        return ContiguousKV(ready.kv_slots, ready.max_rows, cfg.reserve,
                            min(max_context, ready.kv_slots))
    if cfg.kv == "paged" and cfg.fixed_block_size is None:
        return DynamicPagedKV(ready.kv_slots, ready.max_rows)
    if cfg.kv == "paged":
        return PagedKV(ready.kv_slots, ready.max_rows, cfg.fixed_block_size)
    return TokenKV(ready.kv_slots, ready.max_rows)


def build_scheduler(cfg: ServerConfig, ready: WorkerReady, max_context: int) -> Scheduler:
    max_context = min(max_context, ready.max_context)
    kv = build_kv(cfg, ready, max_context)
    # paged preempts like vLLM V1: the last admitted first, only as much as needed
    preempt = dict(retract_key=preempt_order, retract_headroom=0) if cfg.kv == "paged" else {}
    chunk = cfg.chunk_size or (8192 if ready.device.startswith("cuda") else 512)
    sched = Scheduler(kv, chunk_size=chunk, max_running=cfg.max_running,
                      max_context=min(max_context, kv.total),
                      max_in_flight=2 if cfg.use_overlap else 1, **preempt,
                      degrade_waiting=cfg.degrade_waiting,
                      degrade_max_tokens=cfg.degrade_max_tokens,
                      degrade_max_running=cfg.degrade_max_running)
    sched.adder = PrefillAdder(init_ratio=0.7 * cfg.schedule_conservativeness,
                               min_ratio=0.1 * cfg.schedule_conservativeness)
    return sched


def limits(sched: Scheduler, model_max_context: int) -> Limits:
    """The limits the api enforces and advertises: the scheduler's, after every cap."""
    # the scheduler's max_context is already within the pool (one slot to sample into)
    return Limits(max_context=sched.max_context, max_req_input_len=sched.max_context - 1,
                  max_running=sched.base_max_running, kv_slots=sched.kv.total,
                  model_max_context=model_max_context)


def stats(sched: Scheduler, token: int) -> SchedulerStats:
    kv = sched.kv
    error = None
    if not sched.in_flight:
        try:
            sched.check_invariants()
        except AssertionError as exc:
            error = str(exc) or "allocator invariant violated"
    return SchedulerStats(
        token=token, running=len(sched.running), waiting=len(sched.waiting),
        kv_total=kv.total, kv_used=kv.used(), num_steps=sched.num_steps,
        num_retractions=sched.num_retractions, invariant_error=error,
        degraded=sched.degraded, **kv.stats_fields(),
    )


def run_scheduler(cfg: ServerConfig) -> None:
    """Entry point of the scheduler process."""
    log = setup_logging("scheduler", cfg.log_level)
    ctx = zmq.Context()
    inbox: PullQueue = PullQueue(ctx, cfg.ipc("sched_in"), SchedulerInput, bind=True)
    results: PullQueue = PullQueue(ctx, cfg.ipc("sched_res"), WorkerOutput, bind=True)
    # every TP rank runs every plan; rank 0 alone sends the results
    to_workers: FanOutQueue = FanOutQueue(ctx, [cfg.worker_channel(r) for r in range(cfg.tp)])
    to_api: PushQueue = PushQueue(ctx, cfg.ipc("api_in"))
    ready: PushQueue = PushQueue(ctx, cfg.ipc("ready"))
    try:
        spec = resolve_model(cfg.model)
        worker_ready = results.get(timeout_ms=int(cfg.ready_timeout * 1000))
        if not isinstance(worker_ready, WorkerReady):
            raise RuntimeError("the worker did not report ready in time")
        sched = build_scheduler(cfg, worker_ready, spec.max_context)
    except Exception as exc:
        log.exception("scheduler failed to start")
        ready.put(Ready("scheduler", error=error_text(exc)))
        sys.exit(1)
    to_api.put(limits(sched, spec.max_context))  # before Ready: the api serves only after it
    ready.put(Ready("scheduler"))
    log.info("KV pool %d slots, %d rows, kv=%s, overlap=%s, context %d tokens (model: %d)",
             worker_ready.kv_slots, worker_ready.max_rows, cfg.kv, cfg.use_overlap,
             sched.max_context, spec.max_context)
    poller = zmq.Poller()
    poller.register(inbox.sock, zmq.POLLIN)
    poller.register(results.sock, zmq.POLLIN)
    while True:
        for msg in inbox.drain():
            if isinstance(msg, GenerateReq):
                sched.add(msg)
            elif isinstance(msg, AbortReq):
                sched.abort(msg.rid, msg.reason)
            elif isinstance(msg, GetStats):
                to_api.put(stats(sched, msg.token))
            elif isinstance(msg, Shutdown):
                to_workers.put(Shutdown())
                return
        while sched.can_plan():
            plan = sched.plan()
            if plan is None:
                break
            to_workers.put(plan)
        if outs := sched.take_outputs():
            to_api.put(BatchOut(outs))
        # block until a result or a request arrives; no busy polling
        events = dict(poller.poll())
        if results.sock in events:
            res = results.get_nowait()
            if isinstance(res, StepResult):
                sched.on_result(res)
            elif isinstance(res, WorkerFailed):
                log.error("worker failed batch %d: %s", res.batch_id, res.error)
                sched.fail_in_flight(res.error)
            if CHECK_INVARIANTS and not sched.in_flight:
                sched.check_invariants()
            if outs := sched.take_outputs():
                to_api.put(BatchOut(outs))
