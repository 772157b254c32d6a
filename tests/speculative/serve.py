"""Test helper: serve requests in one process (scheduler + worker), with or without a
`Speculation`, and return each request's outputs."""

from __future__ import annotations

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.worker import Worker
from tests.worker.in_process import run_to_end


def serve(cfg: ServerConfig, prompts: list[list[int]], params: list[SamplingParams],
          spec: Speculation | None = None, worker: Worker | None = None,
          ) -> tuple[list[list[int]], Scheduler, Worker]:
    """Run every request to its end: (output ids per request, the scheduler, the worker).
    `spec` replaces the speculation the config asks for (None: keep it)."""
    worker = worker or Worker(cfg, resolve_model(cfg.model))
    sched = build_scheduler(cfg, worker.ready_message(), worker.runner.max_context)
    if spec is not None:
        sched.spec = spec
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        sched.add(GenerateReq(f"r{i}", prompt, p))
    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    run_to_end(sched, worker, outs)
    return [outs[f"r{i}"] for i in range(len(prompts))], sched, worker
