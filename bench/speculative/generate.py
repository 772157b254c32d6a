"""Serve a list of prompts to their end in one process, as the server steps them."""

from __future__ import annotations

import os
import tempfile
import time
from collections import deque
from pathlib import Path

from bench.serving.scrape import file_size, step_idle
from bench.speculative.device_oracle import DeviceOracle, device_oracle_speculation
from bench.speculative.oracle import oracle_speculation
from runtime.config.server import ServerConfig
from runtime.config.speculative import worker_drafts
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.step_timing import ENV as STEP_TIMING
from runtime.worker.worker import Worker


def time_steps() -> Path:
    """Make the workers built from now on log their device step times (read by
    `generate`); the log file."""
    path = Path(tempfile.mkdtemp()) / "steps.jsonl"
    path.touch()
    os.environ[STEP_TIMING] = str(path)
    return path


def generate(worker: Worker, cfg: ServerConfig, prompts: list[list[int]], max_tokens: int,
             oracle: list[list[int]] | None = None, on_device: bool = False) -> dict:
    """Serve `prompts` to their end; outputs, wall seconds, the drafters' counters and,
    with `time_steps()` set before the worker was built, the device's idle share. With
    `oracle` (each request's known output) the oracle drafts: on the host
    (`OracleDrafter`), or `on_device` (`DeviceOracle`, chained behind steps in flight);
    else `cfg`'s algorithm does, in the worker where it drafts there (`worker_drafts`: the
    worker's own drafter, n-gram lookup with overlap) and on the host otherwise."""
    log = os.environ.get(STEP_TIMING)
    seen = file_size(log)
    sched = build_scheduler(cfg, worker.ready_message(), worker.runner.max_context)
    k = cfg.speculative_num_draft_tokens
    device_oracle, own = None, worker.drafter  # the worker's own drafter comes back after
    if oracle is not None and on_device:
        sched.spec = device_oracle_speculation(k)
        device_oracle = DeviceOracle(worker.max_rows, worker.runner.max_context,
                                     worker.device)
        worker.drafter = device_oracle
        whole = {f"r{i}": p + o for i, (p, o) in enumerate(zip(prompts, oracle))}
    elif oracle is not None:
        sched.spec = oracle_speculation({f"r{i}": o for i, o in enumerate(oracle)}, k)
        worker.drafter = None  # the oracle drafts on the host: the worker writes none
    elif not worker_drafts(cfg.speculative_algorithm, cfg.kv_mode.overlap):
        worker.drafter = None  # drafts from the host (or none): the worker writes none
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        sched.add(GenerateReq(f"r{i}", p, params))
    in_flight: deque = deque()
    while sched.has_work or in_flight:
        while sched.can_plan() and (plan := sched.plan()) is not None:
            if device_oracle is not None and plan.inits:
                rid = {r.row: r.rid for r in sched.running}
                for init in plan.inits:
                    device_oracle.bind(init.row, whole[rid[init.row]])
            in_flight.append(worker.launch(plan))
        done = in_flight.popleft()
        sched.on_result(done.result())
        if done.timing is not None:  # the batch completed: its marks can be read
            worker.timer.log(done.batch_id, done.timing)
        for out in sched.take_outputs():
            outs[out.rid] += out.token_ids
    wall = time.perf_counter() - start
    worker.drafter = own
    idle = step_idle(log, seen).get("idle_fraction")
    spec = sched.spec
    return {"outputs": [outs[f"r{i}"] for i in range(len(prompts))], "wall_s": wall,
            "steps": sched.num_steps,
            "accept_length": spec.mean_accept_length if spec else None,
            "drafted": spec.drafted if spec else 0, "accepted": spec.accepted if spec else 0,
            "idle": idle}
