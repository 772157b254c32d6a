"""The scheduler process: requests in, BatchPlans to the worker, token streams to the api.

With overlap, up to two batches are in flight: while the worker runs batch N the loop
has already planned and sent N+1 (its decode inputs refer to N's samples by placeholder),
and only then waits for N's result. Without overlap the same loop keeps one in flight.
Grammar compiles the scheduler asks for go out before the plans that may need them; their
reports arrive on the results socket, so an idle loop wakes for them too.
"""

from __future__ import annotations

import functools
import os
import sys

import zmq

from runtime.config.kv_mode import KVMode
from runtime.config.server import ServerConfig
from runtime.config.speculative import worker_drafts
from runtime.model_config import spec_for
from runtime.model_errors import MODEL_ERRORS
from runtime.procutil import freeze_startup_heap, setup_logging, startup_failure
from runtime.scheduler.entry_ids import EntryIds, paged_entry_ids
from runtime.scheduler.grammar_gate import GrammarGate
from runtime.scheduler.host_tier import HostTier
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.kv_study import build_study_kv
from runtime.scheduler.lora_slots import LoraSlots
from runtime.scheduler.paged_kv import PagedKV
from runtime.scheduler.policy import PrefillAdder, preempt_order
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.speculative.speculation import Speculation
from runtime.scheduler.token_kv import TokenKV
from runtime.wire.api_input import CacheFlushed, Limits, SchedulerStats
from runtime.wire.ipc import FanOutQueue, PullQueue, PushQueue
from runtime.wire.lifecycle import Ready, Shutdown
from runtime.wire.scheduler_input import (
    AbortReq,
    FinishReq,
    FlushCache,
    GenerateReq,
    GetStats,
    SchedulerInput,
)
from runtime.wire.worker_channel import (
    GrammarCompiled,
    StepResult,
    WorkerFailed,
    WorkerOutput,
    WorkerReady,
)

CHECK_INVARIANTS = os.environ.get("SLUICE_CHECK_INVARIANTS", "0") == "1"


def build_kv(mode: KVMode, ready: WorkerReady, max_context: int) -> KVManager:
    """The KV manager of `mode` over the worker's slots (every layout uses the same pool),
    its prefix hits as the model's rule asks, handing out the entry ids the worker asks
    for (`WorkerReady.entry_ids`: the token layout; its host tier's `host_entry_ids`)."""
    entries = EntryIds(ready.kv_slots, ready.entry_ids) if ready.entry_ids else None
    host = None
    if ready.host_kv_slots:
        host_entries, device_ids = None, None
        if ready.host_entry_ids:  # device ids: those slots hold, or those pages give
            host_entries = EntryIds(ready.host_kv_slots, ready.host_entry_ids)
            device_ids = (entries.ids_of if entries is not None
                          else functools.partial(paged_entry_ids, mode.page_size))
        host = HostTier(ready.host_kv_slots, ready.kv_bytes_per_token, host_entries,
                        device_ids)
    if mode.kind == "token":
        kv = TokenKV(ready.kv_slots, ready.max_rows, host, entries)
    elif mode.kind == "paged":
        kv = PagedKV(ready.kv_slots, ready.max_rows, mode.page_size, host)
    else:
        kv = build_study_kv(mode, ready.kv_slots, ready.max_rows, max_context)
    kv.prefix_align, kv.prefix_replay = ready.prefix_align, ready.prefix_replay
    return kv


def build_scheduler(cfg: ServerConfig, ready: WorkerReady, max_context: int) -> Scheduler:
    mode = cfg.kv_mode
    max_context = min(max_context, ready.max_context)
    kv = build_kv(mode, ready, max_context)
    preempt = {}
    if mode.preempt_last_admitted:
        preempt = dict(retract_key=preempt_order, retract_headroom=0)
    chunk = cfg.chunk_size or (8192 if ready.device.startswith("cuda") else 512)
    sched = Scheduler(kv, chunk_size=chunk, max_running=cfg.max_running,
                      max_context=min(max_context, kv.total),
                      max_in_flight=2 if mode.overlap else 1, **preempt,
                      degrade_waiting=cfg.degrade_waiting,
                      degrade_max_tokens=cfg.degrade_max_tokens,
                      degrade_max_running=cfg.degrade_max_running,
                      swap=cfg.preempt == "swap")
    sched.adder = PrefillAdder(init_ratio=0.7 * cfg.schedule_conservativeness,
                               min_ratio=0.1 * cfg.schedule_conservativeness)
    sched.grammars = GrammarGate(cfg.grammar_cache_size, cfg.tp)
    if cfg.lora_paths:
        sched.loras = LoraSlots(cfg.lora_adapters, cfg.max_loras)
    sched.spec = Speculation.from_config(cfg)
    if sched.spec is not None:  # a drafter on the device drafts behind a step in flight
        sched.spec.chains = (mode.overlap and not ready.prefix_replay
                             and worker_drafts(cfg.speculative_algorithm, mode.overlap))
    return sched


def limits(sched: Scheduler, model_max_context: int, ready: WorkerReady) -> Limits:
    """The limits the api enforces and advertises: the scheduler's, after every cap (and
    the worker's weight and KV formats, which the api shows)."""
    # the scheduler's max_context is already within the pool (one slot to sample into)
    return Limits(max_context=sched.max_context, max_req_input_len=sched.max_context - 1,
                  max_running=sched.base_max_running, kv_slots=sched.kv.total,
                  model_max_context=model_max_context, kv_dtype=ready.kv_dtype,
                  quantization=ready.quantization)


def stats(sched: Scheduler, token: int) -> SchedulerStats:
    error = None
    if not sched.in_flight:
        try:
            sched.check_invariants()
        except AssertionError as exc:
            error = str(exc) or "allocator invariant violated"
    kv = sched.kv.stats()
    host = {}
    if kv.host is not None:
        host = dict(host_kv_total=kv.host.total, host_kv_used=kv.host.used,
                    host_hit_tokens=kv.host.hit_tokens, writeback_bytes=kv.host.writeback_bytes,
                    load_bytes=kv.host.load_bytes, writeback_seconds=sched.writeback_seconds,
                    load_seconds=sched.load_seconds, num_swaps=sched.num_swaps)
    return SchedulerStats(
        token=token, running=len(sched.running), waiting=sched.num_waiting,
        kv_total=kv.total, kv_free=kv.free, kv_cached=kv.cached, kv_used=kv.used,
        kv_held=kv.live, num_steps=sched.num_steps, num_retractions=sched.num_retractions,
        prefix_hit_tokens=kv.prefix_hit_tokens, prefix_query_tokens=kv.prefix_query_tokens,
        invariant_error=error, degraded=sched.degraded, **host,
    )


def run_scheduler(cfg: ServerConfig) -> None:
    """Entry point of the scheduler process."""
    log = setup_logging("scheduler", cfg.log_level)
    ctx = zmq.Context()
    inbox: PullQueue = PullQueue(ctx, cfg.ipc("sched_in"), SchedulerInput, bind=True)
    results: PullQueue = PullQueue(ctx, cfg.results_channel, WorkerOutput, bind=True)
    # every TP rank runs every plan; rank 0 alone sends the results. Across hosts the
    # scheduler binds the ranks' channels, so no node needs another's address but node 0's
    to_workers: FanOutQueue = FanOutQueue(ctx, [cfg.worker_channel(r) for r in range(cfg.tp)],
                                          bind=cfg.multi_node)
    to_api: PushQueue = PushQueue(ctx, cfg.ipc("api_in"))
    ready: PushQueue = PushQueue(ctx, cfg.ipc("ready"))
    try:
        spec = spec_for(cfg)
        worker_ready = results.get(timeout_ms=int(cfg.ready_timeout * 1000))
        if not isinstance(worker_ready, WorkerReady):
            raise RuntimeError("the worker did not report ready in time")
        sched = build_scheduler(cfg, worker_ready, spec.max_context)
    except Exception as exc:
        ready.put(Ready("scheduler", error=startup_failure(log, "scheduler", exc, MODEL_ERRORS)))
        sys.exit(1)
    # before Ready: the api serves only after it
    to_api.put(limits(sched, spec.max_context, worker_ready))
    freeze_startup_heap()
    ready.put(Ready("scheduler"))
    mode = cfg.kv_mode
    log.info("KV pool %d slots, %d rows, kv=%s, overlap=%s, context %d tokens (model: %d), "
             "host tier %d slots", worker_ready.kv_slots, worker_ready.max_rows, mode.kind,
             mode.overlap, sched.max_context, spec.max_context, worker_ready.host_kv_slots)
    poller = zmq.Poller()
    poller.register(inbox.sock, zmq.POLLIN)
    poller.register(results.sock, zmq.POLLIN)
    flushes: list[FlushCache] = []  # refused while busy, else done once no batch is in flight
    while True:
        for msg in inbox.drain():
            if isinstance(msg, GenerateReq):
                sched.add(msg)
            elif isinstance(msg, AbortReq):
                sched.abort(msg.rid, msg.reason)
            elif isinstance(msg, FinishReq):
                sched.finish(msg.rid)
            elif isinstance(msg, GetStats):
                to_api.put(stats(sched, msg.token))
            elif isinstance(msg, FlushCache):
                flushes.append(msg)
            elif isinstance(msg, Shutdown):
                to_workers.put(Shutdown())
                return
        if update := sched.take_grammar_update():
            to_workers.put(update)
        while sched.can_plan():
            plan = sched.plan()
            if plan is None:
                break
            to_workers.put(plan)
        if update := sched.take_grammar_update():  # a retraction may need a compile
            to_workers.put(update)
        if batch := sched.take_batch():
            to_api.put(batch)
        if flushes and (sched.has_work or not sched.in_flight):
            for msg in flushes:
                to_api.put(CacheFlushed(msg.token, *sched.flush_cache()))
            flushes.clear()
        # block until a result or a request arrives; no busy polling
        events = dict(poller.poll())
        if results.sock in events:
            res = results.get_nowait()
            if isinstance(res, StepResult):
                sched.on_result(res)
            elif isinstance(res, WorkerFailed):
                log.error("worker failed batch %d: %s", res.batch_id, res.error)
                sched.fail_in_flight(res.error)
            elif isinstance(res, GrammarCompiled):
                sched.on_grammar_compiled(res)
            if CHECK_INVARIANTS and not sched.in_flight:
                sched.check_invariants()
            if batch := sched.take_batch():
                to_api.put(batch)
