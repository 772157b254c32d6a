"""Test helper: serve requests in one process (scheduler + worker), with or without a
`Speculation`, and return each request's outputs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.model_check import prepare_model
from runtime.worker.worker import Worker
from tests.worker.in_process import run_to_end


def start(cfg: ServerConfig, worker: Worker, prompts: list[list[int]],
          params: list[SamplingParams], spec: Speculation | None = None,
          ) -> tuple[Scheduler, dict[str, list[int]]]:
    """A scheduler for `worker` holding requests r0, r1, ... (`spec` replaces the
    speculation the config asks for; None: keep it), and their empty output lists."""
    sched = build_scheduler(cfg, worker.ready_message(), worker.runner.max_context)
    if spec is not None:
        sched.spec = spec
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        sched.add(GenerateReq(f"r{i}", prompt, p))
    return sched, {f"r{i}": [] for i in range(len(prompts))}


def serve(cfg: ServerConfig, prompts: list[list[int]], params: list[SamplingParams],
          spec: Speculation | None = None, worker: Worker | None = None,
          ) -> tuple[list[list[int]], Scheduler, Worker]:
    """Run every request to its end: (output ids per request, the scheduler, the worker).
    A `spec` drafting on the host gets a worker that drafts nothing (`host_drafted`)."""
    worker = worker or Worker(cfg if spec is None else host_drafted(cfg), resolve_model(cfg.model))
    sched, outs = start(cfg, worker, prompts, params, spec)
    run_to_end(sched, worker, outs)
    return [outs[f"r{i}"] for i in range(len(prompts))], sched, worker


def host_drafted(cfg: ServerConfig) -> ServerConfig:
    """`cfg` for a worker serving the verify steps of a drafter on the host (the oracle, in
    place of the config's n-gram lookup): without overlap, the worker leaves n-gram
    drafting to the host, so the drafts the scheduler plans are the ones verified (the
    worker reads overlap for nothing else)."""
    return cfg.replace(overlap=False)


def step_drafts(cfg: ServerConfig, worker: Worker, prompts: list[list[int]],
                params: list[SamplingParams]) -> Iterator[tuple[list[int], list[int]]]:
    """Serve the requests to their end, step by step, yielding (the request's tokens so
    far, its drafts) for each verify request of every step."""
    sched, _ = start(cfg, worker, prompts, params)
    while sched.has_work:
        plan = sched.plan()
        by_row = {r.row: r for r in sched.running}
        res = worker.launch(plan).result()
        drafts = iter(res.draft_ids)
        for row, d in zip(plan.rows, plan.draft_lens):
            if d:
                yield list(by_row[row].token_ids), [next(drafts) for _ in range(d)]
        sched.on_result(res)
        sched.take_outputs()


def greedy_case(cfg: ServerConfig, prompts: list[list[int]], max_tokens: tuple[int, ...],
                ) -> tuple[list[list[int]], list[SamplingParams], list[list[int]]]:
    """(prompts, greedy params of these lengths, plain decoding's outputs under `cfg`)."""
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in max_tokens]
    ref, _, _ = serve(cfg, prompts, params)
    return prompts, params, ref


def retraction_case() -> tuple[list[list[int]], list[SamplingParams]]:
    """16 greedy requests (repeated random prompts of 2-23 ids, 4-32 new tokens) that
    outgrow a pool of 191 slots: running requests get retracted."""
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 1024, (n,), generator=gen).tolist() * 2
               for n in torch.randint(2, 24, (16,), generator=gen).tolist()]
    params = [SamplingParams(max_tokens=m, temperature=0.0)
              for m in torch.randint(4, 33, (16,), generator=gen).tolist()]
    return prompts, params


def refused_at_start_up(cfg: ServerConfig, error: type[Exception], match: str) -> None:
    """Both start-up checks refuse `cfg` with `error` matching `match`: the command's
    (`prepare_model`, before any process starts) and the worker's."""
    with pytest.raises(error, match=match):
        prepare_model(cfg)
    with pytest.raises(error, match=match):
        Worker(cfg, resolve_model(cfg.model))
