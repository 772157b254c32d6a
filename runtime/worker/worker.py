"""The worker process: runs BatchPlans on the model and streams StepResults back.

The main thread only launches work: it never waits for the device, except after a
step that holds regex-constrained rows, whose matchers need the sampled ids before the
next step's mask (see `grammar_rows`). After each batch it records an event and copies
the sampled ids (and any input logprobs) to pinned host memory without blocking; a
sender thread waits on that event and sends the StepResult. On the CPU the event is a
no-op and the same code path runs synchronously.

Nor does it wait for a regex compile: the scheduler asks for one ahead
(`RegexCacheUpdate`), a background thread compiles it, and the sender thread reports it
done (`RegexCompiled`, from every rank, since each needs the grammar).

With `--tp N` there are N worker processes (`worker_targets`). The scheduler sends every
plan to each; they run it in lockstep (the collectives inside the model pair them up),
sample the same ids from the same whole logits, and only rank 0 reports results.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import zmq

from runtime.config import ServerConfig
from runtime.grammar import RegexCompiler
from runtime.ipc import PullQueue, PushQueue
from runtime.messages import (
    BatchPlan,
    Ready,
    RegexCacheUpdate,
    RegexCompiled,
    RowInit,
    SamplingParams,
    Shutdown,
    StepResult,
    WorkerFailed,
    WorkerInput,
    WorkerReady,
)
from runtime.model_config import ModelSpec, resolve_model
from runtime.procutil import error_text, freeze_startup_heap, setup_logging
from runtime.worker.batch_builder import BatchBuilder, SampleInputs
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.grammar_rows import GrammarRows
from runtime.worker.kv_transfer import CopyTiming, KVTransfer, host_slots_for
from runtime.worker.model_runner import ModelRunner
from runtime.worker.step_timing import StepTimer, StepTiming
from runtime.worker.tp import TPGroup, init_tp

ROW_SLACK = 16  # rows beyond max_running: finished requests keep theirs until released


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """The device of TP rank `rank`: `cuda:rank` on a GPU host, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cuda":
        return torch.device(name)
    if rank >= torch.cuda.device_count():
        raise RuntimeError(f"TP rank {rank} needs cuda:{rank}, but only "
                           f"{torch.cuda.device_count()} GPU(s) are visible")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


class _HostEvent:
    """Stands in for a CUDA event on the CPU, where work is already complete."""

    def synchronize(self) -> None:
        pass


@dataclass
class InFlight:
    """A launched batch: its sampled ids are valid in host memory once `event` completes."""

    batch_id: int
    ids: torch.Tensor  # [S] int64, host (pinned on CUDA)
    logprobs: torch.Tensor | None  # [S] float32, host; None when no request asked for them
    event: object
    timing: StepTiming | None = None  # only under SLUICE_STEP_TIMING
    input_logprobs: torch.Tensor | None = None  # [L] float32, host: BatchPlan.input_logprobs
    input_sizes: tuple[int, ...] = ()  # entries of input_logprobs per plan entry
    copies: CopyTiming | None = None  # the plan's host-tier copies, which the step waited for

    def result(self) -> StepResult:
        self.event.synchronize()
        inputs = []
        if self.input_logprobs is not None:
            inputs = [t.tolist() for t in self.input_logprobs.split(self.input_sizes)]
        lps = self.logprobs.tolist() if self.logprobs is not None else []
        res = StepResult(self.batch_id, self.ids.tolist(), lps, inputs)
        if self.copies is not None:
            res.writeback_s, res.load_s = (self.copies.seconds("writeback"),
                                           self.copies.seconds("load"))
        return res


class Worker:
    """Model, KV pool, sampler and token table of one device."""

    def __init__(self, cfg: ServerConfig, spec: ModelSpec, rank: int = 0) -> None:
        self.device = resolve_device(cfg.device, rank)
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.tp: TPGroup = init_tp(rank, cfg.tp, self.device,
                                   os.path.join(cfg.ipc_dir, f"{cfg.run_id}-tp-store"))
        self.max_rows = cfg.max_running + ROW_SLACK
        self.page_size = cfg.kv_mode.page_size
        self.runner = ModelRunner(spec, self.device, resolve_dtype(cfg.dtype, self.device),
                                  kv_slots=cfg.kv_slots, max_rows=self.max_rows, seed=cfg.seed,
                                  mem_fraction=cfg.mem_fraction, cuda_graph=cfg.cuda_graph,
                                  kv_dtype=cfg.kv_dtype, page_size=self.page_size, tp=self.tp,
                                  attention_backend=cfg.attention_backend)
        self.builder = BatchBuilder(self.max_rows, self.runner.max_context, self.device,
                                    self.page_size)
        compiler = None
        if spec.tokenizer_path is not None:
            compiler = RegexCompiler(str(spec.tokenizer_path), self.runner.vocab_size,
                                     list(spec.eos_token_ids))
        self.grammar = GrammarRows(compiler, self.runner.vocab_size, list(spec.eos_token_ids),
                                   self.device)
        self.timer = StepTimer.from_env(self.device)  # None unless SLUICE_STEP_TIMING is set
        self.transfer: KVTransfer | None = None  # the host tier, with --host-kv-gib
        if cfg.host_kv_gib:
            slots = host_slots_for(cfg.host_kv_gib, self.runner.kv_bytes_per_token, cfg.tp)
            self.transfer = KVTransfer(self.runner.kv_pool, self.tp.min_int(slots))

    def warm_up(self) -> None:
        """Run one prefill (chunked in two) through the whole step path before serving, so
        the extend kernels are compiled before the first request (decode is warmed by
        CUDA graph capture). It uses row 0 and the slots from page 1 on, which hold
        nothing yet."""
        ps = self.page_size
        n = min(64, self.runner.kv_slots + 1 - ps, self.runner.max_context - 1)
        half = n // 2
        ids = list(range(3, 3 + n))
        pages = list(range(1, 1 + -(-n // ps)))  # page p holds slots p * ps onwards
        split = -(-half // ps)  # pages the first chunk starts
        first = BatchPlan(batch_id=-2, rows=[0], prefix_lens=[0], extend_lens=[half],
                          input_ids=ids[:half], new_pages=pages[:split], sample=[False],
                          inits=[RowInit(row=0, params=SamplingParams(max_tokens=1))])
        second = BatchPlan(batch_id=-1, rows=[0], prefix_lens=[half], extend_lens=[n - half],
                           input_ids=ids[half:], new_pages=pages[split:], sample=[True])
        for plan in (first, second):
            self.launch(plan).result()

    def ready_message(self) -> WorkerReady:
        r = self.runner
        return WorkerReady(kv_slots=r.kv_slots, max_rows=self.max_rows,
                           max_context=r.max_context,
                           kv_bytes_per_token=r.kv_bytes_per_token * self.tp.size,
                           device=str(self.device),
                           host_kv_slots=self.transfer.num_slots if self.transfer else 0)

    @torch.inference_mode()
    def launch(self, plan: BatchPlan) -> InFlight:
        """Enqueue one step; returns before the device finishes it."""
        start = (self.timer.mark(), time.perf_counter()) if self.timer is not None else None
        sampler = self.runner.sampler
        for init in plan.inits:
            sampler.init_row(init.row, init.params, init.prompt_ids, init.output_ids)
            self.grammar.init_row(init.row, init.params.regex, init.output_ids)
        copies = self.transfer.run(plan) if self.transfer is not None else None
        fb, inputs = self.builder.build(plan)
        logits = self.runner.forward(fb)  # [S + L, vocab] float32
        n = len(inputs.rows)
        input_lps = self._input_logprobs(logits[n:], inputs)  # [L] or None
        if n:
            allowed = self.grammar.allowed(inputs.rows)
            ids, logprobs = sampler.sample(logits[:n], inputs.rows, inputs.positions, allowed,
                                           rows_dev=inputs.rows_dev, all_logprobs=False)
            self.builder.record(inputs.rows_dev, ids)
            self.grammar.advance(inputs.rows, ids)
        else:
            ids, logprobs = torch.zeros(0, dtype=torch.int64, device=self.device), None
        sizes = inputs.logprob_sizes
        if self.device.type != "cuda":
            return InFlight(plan.batch_id, ids, logprobs, _HostEvent(), self._timing(start, fb),
                            input_lps, sizes, copies)
        ids_host = _to_host(ids)
        lps_host = _to_host(logprobs) if logprobs is not None else None
        inputs_host = _to_host(input_lps) if input_lps is not None else None
        timing = self._timing(start, fb)
        event = torch.cuda.Event()
        event.record()
        return InFlight(plan.batch_id, ids_host, lps_host, event, timing, inputs_host, sizes,
                        copies)

    def _input_logprobs(self, logits: torch.Tensor, inputs: SampleInputs) -> torch.Tensor | None:
        """Input logprobs: log_softmax of `logits` [L, V] at the prompt tokens that follow
        their positions: [L] float32, or None when the plan asks for none."""
        if not inputs.logprob_sizes:
            return None
        targets = inputs.logprob_targets  # [L]
        chosen = logits.gather(1, targets[:, None])[:, 0]  # [L]
        return chosen - torch.logsumexp(logits, dim=-1)  # [L]

    def _timing(self, start, fb: ForwardBatch) -> StepTiming | None:
        if start is None:
            return None
        mark, host_start = start
        return StepTiming(mark, self.timer.mark(), fb.batch_size, fb.num_tokens, fb.is_decode,
                          host_ms=(time.perf_counter() - host_start) * 1e3)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of `t`, enqueued without waiting (valid once the step's event
    completes); a fresh buffer each step, so no later step can overwrite it early."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _send_results(out: PushQueue, pending: queue.Queue, timer: StepTimer | None,
                  report_steps: bool) -> None:
    """Sender thread: wait for each launched batch in order and send its result, and
    send each `RegexCompiled` queued by the compile thread. Only rank 0 reports steps
    (`report_steps`): the other ranks only wait, so their buffers retire in order."""
    while True:
        item = pending.get()
        if item is None:
            return
        if isinstance(item, InFlight):
            result = item.result()
            if item.timing is not None:  # the batch completed: its marks can be read
                timer.log(item.batch_id, item.timing)
            item = result
        if report_steps or isinstance(item, RegexCompiled):
            out.put(item)


def worker_name(rank: int) -> str:
    return "worker" if rank == 0 else f"worker{rank}"


def worker_targets(cfg: ServerConfig) -> dict[str, Callable[[ServerConfig], None]]:
    """The worker processes of a server, by name: one per TP rank."""
    return {worker_name(r): functools.partial(run_worker, rank=r) for r in range(cfg.tp)}


def run_worker(cfg: ServerConfig, rank: int = 0) -> None:
    """Entry point of the worker process of TP rank `rank`."""
    name = worker_name(rank)
    log = setup_logging(name, cfg.log_level)
    ctx = zmq.Context()
    inbox: PullQueue = PullQueue(ctx, cfg.worker_channel(rank), WorkerInput, bind=True)
    out: PushQueue = PushQueue(ctx, cfg.ipc("sched_res"))
    ready: PushQueue = PushQueue(ctx, cfg.ipc("ready"))
    try:
        worker = Worker(cfg, resolve_model(cfg.model), rank)
        if worker.device.type == "cuda":
            worker.warm_up()
    except Exception as exc:  # report the cause to the launcher, then die
        log.exception("%s failed to start", name)
        ready.put(Ready(name, error=error_text(exc)))
        sys.exit(1)
    if rank == 0:
        out.put(worker.ready_message())
    log.info("model %s on %s (TP rank %d of %d), KV pool %d tokens of %s (%d bytes/token "
             "on this rank)", cfg.model, worker.device, rank, cfg.tp, worker.runner.kv_slots,
             worker.runner.kv_pool.dtype, worker.runner.kv_bytes_per_token)
    freeze_startup_heap()
    ready.put(Ready(name))
    pending: queue.Queue = queue.Queue()
    sender = threading.Thread(target=_send_results,
                              args=(out, pending, worker.timer, rank == 0), daemon=True)
    sender.start()
    compiled = lambda regex, error: pending.put(RegexCompiled(regex, rank, error))
    while True:
        msg = inbox.get()
        if isinstance(msg, Shutdown):
            break
        if isinstance(msg, RegexCacheUpdate):
            worker.grammar.evict(msg.evict)
            worker.grammar.prepare(msg.compile, compiled)
            continue
        try:
            pending.put(worker.launch(msg))
        except Exception as exc:
            log.exception("batch %d failed", msg.batch_id)
            pending.put(WorkerFailed(msg.batch_id, error_text(exc)))
    pending.put(None)
    sender.join(timeout=5)
    worker.grammar.close()
    if worker.tp.size > 1:
        torch.distributed.destroy_process_group()
