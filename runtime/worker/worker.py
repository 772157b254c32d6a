"""The worker process: runs BatchPlans on the model and streams StepResults back.

The main thread only launches work: it never waits for the device, except after a
step that holds grammar-constrained rows, whose matchers need the sampled ids before the
next step's mask (see `grammar_rows`). After each batch it records an event and copies
the step's results (`StepOutput`: sampled ids, and any logprobs and top alternatives) to
pinned host memory without blocking; a sender thread waits on that event and sends the
StepResult. On the CPU the event is a no-op and the same code path runs synchronously.
With a drafter on the device (`--speculative-algorithm draft|eagle|mtp`) the drafter runs
the step's forward, its drafting around the target's (`Drafter`).

Nor does it wait for a grammar compile: the scheduler asks for one ahead
(`GrammarCacheUpdate`), a background thread compiles it, and the sender thread reports it
done (`GrammarCompiled`, from every rank, since each needs the grammar).

With `--tp N` there are N worker processes (`worker_targets`). The scheduler sends every
plan to each; they run it in lockstep (the collectives inside the model pair them up),
sample the same ids from the same whole logits, and only rank 0 reports results.
"""

from __future__ import annotations

import functools
import queue
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
import zmq

from runtime.config.server import ServerConfig
from runtime.grammar import GrammarCompiler
from runtime.model_config import ModelSpec, spec_for
from runtime.procutil import error_text, freeze_startup_heap, setup_logging, startup_failure
from runtime.wire.ipc import PullQueue, PushQueue
from runtime.wire.lifecycle import Ready, Shutdown
from runtime.wire.sampling import SamplingParams
from runtime.wire.worker_channel import (
    BatchPlan,
    GrammarCacheUpdate,
    GrammarCompiled,
    RowInit,
    WorkerFailed,
    WorkerInput,
    WorkerReady,
)
from runtime.worker.batch_builder import BatchBuilder, SampleInputs
from runtime.worker.cpu_threads import ThreadTuner
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.grammar_rows import GrammarRows
from runtime.worker.in_flight import InFlight, send_results
from runtime.worker.kv_transfer import KVTransfer, host_slots_for
from runtime.worker.lora.manager import LoraOptions
from runtime.worker.model_check import LOAD_ERRORS
from runtime.worker.model_runner import ModelRunner
from runtime.worker.speculative.drafters import (
    Drafter,
    graph_rows,
    load_drafter,
    verify_drafts,
)
from runtime.worker.step_output import StepOutput, gather_top_logprobs, top_positions
from runtime.worker.step_timing import StepTimer, StepTiming
from runtime.worker.tp import TPGroup, init_tp

ROW_SLACK = 16  # rows beyond max_running: finished requests keep theirs until released


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """The device of the host's `rank`-th TP rank: `cuda:rank` on a GPU host, else the CPU."""
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


class Worker:
    """Model, KV pool, sampler and token table of one device."""

    def __init__(self, cfg: ServerConfig, spec: ModelSpec, rank: int = 0) -> None:
        self.device = resolve_device(cfg.device, rank - cfg.local_ranks.start)
        self.threads = ThreadTuner.for_worker(cfg.torch_threads, self.device,
                                              len(cfg.local_ranks))
        self.tp: TPGroup = init_tp(rank, cfg.tp, self.device, cfg.tp_init_method)
        self.max_rows = cfg.max_running + ROW_SLACK
        self.page_size = cfg.kv_mode.page_size
        dtype = resolve_dtype(cfg.dtype, self.device)
        # --speculative-algorithm draft|eagle|mtp (ngram with overlap): loaded first, the
        # pool is sized after it
        self.drafter: Drafter | None = load_drafter(cfg, spec, self.device, dtype, self.tp)
        drafter = self.drafter
        extra = drafter.kv_bytes_per_token if drafter else 0  # a slot's in its pools
        self.runner = ModelRunner(spec, self.device, dtype,
                                  kv_slots=cfg.kv_slots, max_rows=self.max_rows, seed=cfg.seed,
                                  mem_fraction=cfg.mem_fraction, cuda_graph=cfg.cuda_graph,
                                  kv_dtype=cfg.kv_dtype, page_size=self.page_size, tp=self.tp,
                                  attention_backend=cfg.attention_backend,
                                  quantization=cfg.quantization,
                                  lora=LoraOptions.from_config(cfg),
                                  kv_bytes_extra=extra,
                                  graph_rows=graph_rows(cfg, self.max_rows),
                                  max_drafts=verify_drafts(cfg),
                                  capture=drafter.capture if drafter else None,
                                  entry_table=cfg.kv_mode.kind == "token")
        if drafter is not None:
            drafter.allocate(self.runner, cfg.attention_backend)
        # what a slot holds on this rank: the target's KV share and the drafter's rows
        self.slot_bytes = self.runner.kv_bytes_per_token + extra
        self.builder = BatchBuilder(self.max_rows, self.runner.max_context, self.device,
                                    self.page_size,
                                    self.runner.lora.num_slots if self.runner.lora else 0,
                                    self.runner.max_decode_rows)
        compiler = None
        if spec.tokenizer_path is not None:
            compiler = GrammarCompiler(str(spec.tokenizer_path), self.runner.vocab_size,
                                       list(spec.eos_token_ids))
        self.grammar = GrammarRows(compiler, self.runner.vocab_size, list(spec.eos_token_ids),
                                   self.device)
        self.timer = StepTimer.from_env(self.device)  # None unless SLUICE_STEP_TIMING is set
        self.transfer: KVTransfer | None = None  # the host tier, with --host-kv-gib
        self.host_entry_ids: dict[int, int] = {}  # host entry ids the scheduler hands out
        if cfg.host_kv_gib:
            slots = self.tp.min_int(host_slots_for(cfg.host_kv_gib, self.slot_bytes, cfg.tp))
            entries = self.runner.host_entry_pools(slots)  # carried with their slots
            self.host_entry_ids = {m: n - 1 for m, (_, n) in entries.items()}
            self.transfer = KVTransfer(self.runner.kv_pool, slots,
                                       drafter.slot_tensors() if drafter else (), entries)

    def warm_up(self) -> None:
        """Run one prefill (chunked in two) through the whole step path before serving, so
        the extend kernels are compiled before the first request (decode is warmed by
        CUDA graph capture). It uses row 0 and the slots from page 1 on, which hold
        nothing yet; with LoRA adapters, one of them in slot 0 (the scheduler loads every
        slot before its first use)."""
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
        if self.runner.lora is not None:
            first.lora_loads = [(0, next(iter(self.runner.lora.host)))]
            first.lora_slots = second.lora_slots = [0]
        for plan in (first, second):
            self.launch(plan).result()

    def ready_message(self) -> WorkerReady:
        r = self.runner
        return WorkerReady(kv_slots=r.kv_slots, max_rows=self.max_rows,
                           max_context=r.max_context,
                           kv_bytes_per_token=self.slot_bytes * self.tp.size,
                           device=str(self.device), kv_dtype=r.kv_dtype,
                           quantization=r.quantization,
                           host_kv_slots=self.transfer.num_slots if self.transfer else 0,
                           prefix_align=r.prefix_align, prefix_replay=r.prefix_replay,
                           entry_ids=r.entry_ids, host_entry_ids=self.host_entry_ids)

    @torch.inference_mode()
    def launch(self, plan: BatchPlan) -> InFlight:
        """Enqueue one step; returns before the device finishes it."""
        start = (self.timer.mark(), time.perf_counter()) if self.timer is not None else None
        sampler = self.runner.sampler
        for init in plan.inits:
            sampler.init_row(init.row, init.params, init.prompt_ids, init.output_ids)
            self.grammar.init_row(init.row, init.params.grammar, init.output_ids)
        if plan.inits:
            self.runner.model.bind_rows([init.row for init in plan.inits])
        if plan.entry_writes:
            self.runner.model.write_entries(plan.entry_writes)
        copies = self.transfer.run(plan) if self.transfer is not None else None
        if plan.lora_loads:
            self.runner.lora.load_slots(plan.lora_loads)
        fb, inputs = self.builder.build(plan)
        if self.drafter is None:
            logits, drafts = self.runner.forward(fb), None  # [S + L, vocab] float32
        else:  # the drafts [D] or None
            logits, drafts = self.drafter.step(plan, fb, self.builder, self.runner)
        n = len(inputs.rows)
        out = StepOutput(torch.zeros(0, dtype=torch.int64, device=self.device),
                         input_logprobs=self._input_logprobs(logits[n:], inputs),  # [L]
                         input_sizes=inputs.logprob_sizes, draft_ids=drafts)
        if n:
            allowed = self.grammar.allowed(inputs.rows)
            out.next_ids, out.logprobs = sampler.sample(
                logits[:n], inputs.rows, inputs.positions, allowed, rows_dev=inputs.rows_dev,
                all_logprobs=False)
            self.builder.record(*inputs.last_samples(out.next_ids))
            self.builder.record_verified(inputs, out.next_ids, fb.input_ids)
            self.grammar.advance(inputs.rows, out.next_ids)
        self._top_logprobs(out, logits, plan, inputs)
        return InFlight.launch(plan.batch_id, out, self.device, self._timing(start, fb), copies)

    def _top_logprobs(self, out: StepOutput, logits: torch.Tensor, plan: BatchPlan,
                      inputs: SampleInputs) -> None:
        """The top alternatives of the rows of `logits` [S + L, V] whose requests asked
        (sampled rows, then input-logprob positions) into `out`; nothing when none asked."""
        sampler = self.runner.sampler
        top_n = sampler.top_n(inputs.rows)  # [S]
        entry_rows = np.array([plan.rows[i] for i, _, _ in plan.input_logprobs], dtype=np.int64)
        input_top_n = sampler.top_n(entry_rows)  # [E]
        if not top_n.any() and not input_top_n.any():
            return
        index, out.num_top, k = top_positions(top_n, input_top_n, inputs.logprob_sizes)
        out.top_ids, out.top_logprobs = gather_top_logprobs(logits, index, k)  # [N + M, k] x2

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


def worker_name(rank: int) -> str:
    return "worker" if rank == 0 else f"worker{rank}"


def worker_targets(cfg: ServerConfig) -> dict[str, Callable[[ServerConfig], None]]:
    """The worker processes of a server on this host, by name: one per local TP rank."""
    return {worker_name(r): functools.partial(run_worker, rank=r) for r in cfg.local_ranks}


def run_worker(cfg: ServerConfig, rank: int = 0) -> None:
    """Entry point of the worker process of TP rank `rank`."""
    name = worker_name(rank)
    log = setup_logging(name, cfg.log_level)
    ctx = zmq.Context()
    inbox: PullQueue = PullQueue(ctx, cfg.worker_channel(rank), WorkerInput,
                                 bind=not cfg.multi_node)
    out: PushQueue = PushQueue(ctx, cfg.results_channel)
    ready: PushQueue = PushQueue(ctx, cfg.ipc("ready"))
    try:
        worker = Worker(cfg, spec_for(cfg), rank)
        if worker.device.type == "cuda":
            worker.warm_up()
    except Exception as exc:  # report the cause to the launcher, then die
        ready.put(Ready(name, error=startup_failure(log, name, exc, LOAD_ERRORS)))
        sys.exit(1)
    if rank == 0:
        out.put(worker.ready_message())
    log.info("model %s on %s (TP rank %d of %d), KV pool %d tokens of %s (%d bytes/token "
             "on this rank)", cfg.model, worker.device, rank, cfg.tp, worker.runner.kv_slots,
             worker.runner.kv_pool.dtype, worker.runner.kv_bytes_per_token)
    freeze_startup_heap()
    ready.put(Ready(name))
    pending: queue.Queue = queue.Queue()
    sender = threading.Thread(target=send_results,
                              args=(out, pending, worker.timer, rank == 0), daemon=True)
    sender.start()
    compiled = lambda key, error: pending.put(GrammarCompiled(key, rank, error))
    while True:
        msg = inbox.get()
        if isinstance(msg, Shutdown):
            break
        if isinstance(msg, GrammarCacheUpdate):
            worker.grammar.evict(msg.evict)
            worker.grammar.prepare(msg.compile, compiled)
            continue
        try:
            start = time.perf_counter()
            pending.put(worker.launch(msg))
            if worker.threads is not None:  # a CPU step is done when launch returns
                worker.threads.observe(msg, time.perf_counter() - start)
        except Exception as exc:
            log.exception("batch %d failed", msg.batch_id)
            pending.put(WorkerFailed(msg.batch_id, error_text(exc)))
    pending.put(None)
    sender.join(timeout=5)
    worker.grammar.close()
    if worker.tp.size > 1:
        torch.distributed.destroy_process_group()
