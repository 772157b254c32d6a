"""One engine on one group, driven from the driver's process: an offline child, or a
server the load generator is pointed at. Each returns what the engine reported (start-up,
version, defaults) and per row the list of per-run metrics, or {"error": why}; the GPU is
empty again when it returns."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.peers.clients import ClientFailed, flat_summary
from bench.peers.protocol import Job
from bench.peers.workloads import Group, Row, vocab_size, warmup
from bench.serving.data import RequestSpec
from bench.serving.driver import _served_model, run_load
from bench.serving.metrics import summarize
from bench.serving.multiturn import chat_turns, run_chats
from bench.serving.scrape import parse_prometheus
from bench.serving.server_proc import ROOT, ServerFailed, SluiceServer, wait_gpu_released

BUDGET_SPENT = "skipped: the time budget (--budget-s) is spent"
# (hit tokens, looked-up tokens) counters of the prefix cache, by server
PREFIX_COUNTERS = (
    ("sluice_prefix_cache_hit_tokens_total", "sluice_prefix_cache_query_tokens_total"),
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
)


@dataclass(frozen=True)
class EngineRef:
    """An engine module of the protocol and the environment its processes run in."""

    name: str
    module: str
    env: dict
    missing: str | None = None  # why it cannot run here


def offline(ref: EngineRef, job: Job, work: Path, deadline: float) -> dict:
    """`python -m <module> offline` on the job, in its own process; its result."""
    name = f"{job.group.name}-{ref.name}"
    job_path, out = work / f"{name}.job.json", work / f"{name}.out.json"
    job.write(job_path)
    out.unlink(missing_ok=True)
    timeout = min(job.group.timeout_s, deadline - time.monotonic())
    if timeout < 10:
        return {"error": BUDGET_SPENT}
    cmd = [sys.executable, "-m", ref.module, "offline", "--job", str(job_path), "--out", str(out)]
    print(f"=== {name} (timeout {timeout:.0f} s)", flush=True)
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ref.env},
                            timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        wait_gpu_released()
    if rc != 0 or not out.is_file():
        return {"error": f"exit code {rc} (its traceback is in the log above)"}
    result = json.loads(out.read_text())
    for row in job.group.rows:
        runs = result["rows"][row.name]["runs"]
        result["rows"][row.name]["runs"] = [offline_metrics(row, r) for r in runs]
    return result


def offline_metrics(row: Row, run: dict) -> dict:
    out, total = run["output_tokens"], run["output_tokens"] + run["input_tokens"]
    return {"out_tok_s": out / run["wall_s"], "total_tok_s": total / run["wall_s"],
            "wall_s": run["wall_s"], "complete": out == row.batch * row.output_len}


class EngineServer(SluiceServer):
    """`python -m <module> serve` of an engine, ready once GET /health answers 200."""

    def __init__(self, ref: EngineRef, job_path: Path, log_path: Path) -> None:
        super().__init__([], log_path, ref.env)
        self.cmd = [sys.executable, "-m", ref.module, "serve", "--job", str(job_path),
                    "--port", str(self.port)]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (OSError, urllib.error.HTTPError):
            return False


def served(ref: EngineRef, job: Job, run_row: Callable[..., dict], work: Path,
           deadline: float) -> dict:
    """Start the engine's server, warm it up, run every row `job.repeats` times with
    `run_row(url, model, group, row, repeat, deadline, tokenizer)`, stop it."""
    name = f"{job.group.name}-{ref.name}"
    job.write(work / f"{name}.job.json")
    server = EngineServer(ref, work / f"{name}.job.json", work / f"{name}.log")
    result: dict = {"engine": ref.name, "command": " ".join(server.cmd[1:]),
                    "options": job.options, "rows": {}}
    timeout = min(job.group.timeout_s, deadline - time.monotonic())
    if timeout < 10:
        return {"error": BUDGET_SPENT}
    print(f"=== {name} (start-up timeout {timeout:.0f} s)", flush=True)
    try:
        server.start(timeout)
        result["start_s"] = server.start_s
        model = _served_model(server.url)
        result["model"] = model
        _warm_up(server.url, model, job.group, deadline)
        for row in job.group.rows:
            runs = result["rows"].setdefault(row.name, {"runs": []})["runs"]
            for repeat in range(job.repeats):
                if time.monotonic() > deadline - 5:
                    result["rows"][row.name]["error"] = BUDGET_SPENT
                    break
                runs.append(run_row(server.url, model, job.group, row, repeat, deadline,
                                    job.model_dir))
                print(f"[{ref.name}] {row.name}: {runs[-1]['out_tok_s']:.1f} out tok/s",
                      flush=True)
    except (ServerFailed, ClientFailed, OSError, asyncio.TimeoutError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
    finally:
        server.stop()
        wait_gpu_released()
    return result


def _warm_up(url: str, model: str, group: Group, deadline: float) -> None:
    """A few short requests first, the same for every server and generator."""
    batch, max_tokens = warmup(group, group.rows[0])
    specs = [RequestSpec(p[:64], max_tokens) for p in batch]
    asyncio.run(run_load(url, model, specs, concurrency=len(specs), progress=False,
                         deadline=max(1.0, deadline - time.monotonic())))


def multiturn_row(url: str, model: str, group: Group, row: Row, repeat: int,
                  deadline: float, tokenizer: str) -> dict:
    """The chats of `row` (`bench.serving.multiturn`, seed `repeat`) once, with the
    prefix-cache hit rate the server counted over them."""
    rounds = chat_turns(row.requests, row.turns, row.input_len, row.output_len,
                        vocab_size(group.preset), seed=repeat + 1)
    before = prefix_counters(url)
    results, duration = asyncio.run(asyncio.wait_for(
        run_chats(url, model, rounds, row.batch), max(1.0, deadline - time.monotonic())))
    after = prefix_counters(url)
    out = flat_summary(summarize(results, duration))
    if before and after and after[1] > before[1]:
        out["prefix_hit_rate"] = (after[0] - before[0]) / (after[1] - before[1])
    return out


def prefix_counters(url: str) -> tuple[float, float] | None:
    """(hit, looked-up) prefix-cache tokens so far, from /metrics; None if not exported."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            sample = parse_prometheus(resp.read().decode())
    except (OSError, urllib.error.HTTPError):
        return None
    for hits, queries in PREFIX_COUNTERS:
        found = [sum(v for k, v in sample.items() if k.split("{")[0] == name)
                 for name in (hits, queries)]
        if any(k.split("{")[0] == queries for k in sample):
            return found[0], found[1]
    return None
