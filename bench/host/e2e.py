"""Host path, end to end: offline (`Engine`) vs served (HTTP) output tok/s, and how busy the
GPU is meanwhile; plus token vs paged KV offline.

- `e2e`: per model, the same `--e2e-requests` prompts of `--e2e-input-len` random ids, each
  generating `--e2e-output-len` tokens (greedy, ignore_eos), `--e2e-concurrency` decoding at
  once: through `Engine.generate` in-process, then through `sluice serve` and the streaming
  client of `bench.serving` at that concurrency. Output tok/s = output tokens / wall time
  (after a warm-up at full batch). From the worker's SLUICE_STEP_TIMING log: the median
  device step, the median idle gap between steps and busy = steps / (steps + gaps).
- `kv`: `--kv-model` offline, `--kv-batch` x `--kv-input-len` in / `--kv-output-len` out, in
  `--kv token` and `--kv paged` mode, both with overlap; paged / token.

Each model's row is emitted as soon as it completes. `--budget-s` counts from the start of
the command (`args.deadline`): after it, no run starts (the worker part obeys it too).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.serving.data import RequestSpec, random_requests
from bench.serving.metrics import percentile
from bench.serving.scrape import file_size, step_idle

ENV = "SLUICE_STEP_TIMING"
DEFAULT_MODELS = "dummy:tiny,dummy:llama3-1b,dummy:llama3-8b"


def add_args(parser) -> None:
    """The options of the worker and e2e parts."""
    g = parser.add_argument_group("worker and e2e parts (CUDA, or --device cpu to smoke-test)")
    g.add_argument("--e2e-models", default=DEFAULT_MODELS, help="comma-separated")
    g.add_argument("--e2e-modes", default="offline,served", help="subset of offline,served")
    g.add_argument("--e2e-requests", type=int, default=1024)
    g.add_argument("--e2e-concurrency", type=int, default=256, help="decodes at once")
    g.add_argument("--e2e-input-len", type=int, default=128)
    g.add_argument("--e2e-output-len", type=int, default=256)
    g.add_argument("--worker-steps", type=int, default=64, help="timed decode steps")
    g.add_argument("--worker-prefill-tokens", type=int, default=8192,
                   help="prompt tokens per synthetic prefill plan")
    g.add_argument("--kv-model", default="dummy:llama-7b", help="'' skips token vs paged")
    g.add_argument("--kv-batch", type=int, default=64)
    g.add_argument("--kv-input-len", type=int, default=512)
    g.add_argument("--kv-output-len", type=int, default=128)
    g.add_argument("--torch-threads", type=int, default=None,
                   help="the worker's torch threads; default 1 with --device cpu (a busy "
                        "2-core box stalls on thread barriers), else torch's own")
    g.add_argument("--start-timeout", type=float, default=300, help="per engine / server")
    g.add_argument("--budget-s", type=float, default=480,
                   help="start no model or run after this many seconds of the whole command")


def _vocab(model: str) -> int:
    from runtime.model_presets import DUMMY_PRESETS

    return DUMMY_PRESETS[model.removeprefix("dummy:")]["vocab_size"] if model.startswith(
        "dummy:") else 32000


def step_summary(path: str, offset: int) -> dict:
    """`step_idle` of the steps logged after byte `offset`, plus busy = 1 - idle fraction and
    the median host ms the worker spent enqueueing a decode step (where it logs `host_ms`)."""
    steps = step_idle(path, offset)
    idle = steps.get("idle_fraction")
    host = []
    if steps:
        with open(path, "rb") as f:
            f.seek(offset)
            host = [r["host_ms"] for r in map(json.loads, f.read().splitlines()[1:])
                    if r.get("decode") and r.get("host_ms") is not None]
    return {**steps, "busy": None if idle is None or idle != idle else 1.0 - idle,
            "host_ms_p50": percentile(host, 50) if host else None}


def _warm_specs(specs: list[RequestSpec], n: int) -> list[RequestSpec]:
    """`n` prompts as long as the first `n`, 8 output tokens each: compiles prefill and
    full-batch decode. Reversed, so the measured run finds none of them in the prefix
    cache (a hit would skip its prefill and flatter whichever mode caches more)."""
    return [RequestSpec(s.prompt[::-1], 8) for s in specs[:n]]


def offline(model: str, args, specs: list[RequestSpec], concurrency: int, step_file: str,
            **options) -> dict:
    """`Engine.generate` of every spec at once, at most `concurrency` running."""
    from bench.serving.server_proc import wait_gpu_released
    from runtime import Engine, SamplingParams

    os.environ[ENV] = step_file  # the worker process, spawned now, inherits it
    t0 = time.perf_counter()
    try:
        eng = Engine(model=model, device=args.device, dtype=args.dtype, max_running=concurrency,
                     max_queue=max(1024, len(specs)), log_level="warning",
                     ready_timeout=args.start_timeout, torch_threads=args.torch_threads,
                     **options)
    finally:
        del os.environ[ENV]
    with eng:
        start_s = time.perf_counter() - t0
        warm = _warm_specs(specs, concurrency)
        eng.generate([s.prompt for s in warm], SamplingParams(max_tokens=8, ignore_eos=True))
        offset = file_size(step_file)
        params = SamplingParams(max_tokens=specs[0].max_tokens, temperature=0.0,
                                ignore_eos=True)
        t0 = time.perf_counter()
        outs = eng.generate([s.prompt for s in specs], params)
        wall = time.perf_counter() - t0
    wait_gpu_released()  # the next engine sizes its KV pool from the free memory
    tokens = sum(len(o.token_ids) for o in outs)
    return {"start_s": start_s, "wall_s": wall, "requests": len(outs), "completed": len(outs),
            "output_tokens": tokens, "tok_s": tokens / wall,
            "steps": step_summary(step_file, offset)}


def served(model: str, args, specs: list[RequestSpec], concurrency: int, step_file: str,
           work: Path) -> dict:
    """`sluice serve`, then the streaming HTTP client with `concurrency` requests in flight."""
    from bench.serving.driver import run_load
    from bench.serving.server_proc import SluiceServer, wait_gpu_released

    server = SluiceServer(["--model", model, "--device", args.device, "--dtype", args.dtype,
                           "--max-running", str(concurrency),
                           "--max-queue", str(max(1024, len(specs))), "--log-level", "warning",
                           "--torch-threads", str(args.torch_threads)],
                          work / f"server-{model.replace(':', '-')}.log", env={ENV: step_file})
    server.start(timeout=args.start_timeout)
    try:
        warm = _warm_specs(specs, concurrency)
        asyncio.run(run_load(server.url, model, warm, concurrency=concurrency, progress=False))
        offset = file_size(step_file)
        run = asyncio.run(run_load(server.url, model, specs, concurrency=concurrency,
                                   progress=False))
    finally:
        server.stop()
        wait_gpu_released()
    rep = run.report()
    c = rep["client"]
    return {"start_s": server.start_s, "wall_s": c["duration_s"], "requests": c["requests"],
            "completed": c["completed"], "failed": c["failed"],
            "output_tokens": c["total_output_tokens"], "tok_s": c["output_throughput"],
            "ttft_ms_p50": c["ttft_ms"].get("p50"), "tpot_ms_p50": c["tpot_ms"].get("p50"),
            "steps": step_summary(step_file, offset)}


class Budget:
    """Refuses to start a run after `deadline` (time.monotonic())."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def run(self, fn: Callable[..., dict], *args, **kwargs) -> dict:
        """`fn(*args, **kwargs)`, or {"error": why} if it raised or the budget is spent."""
        if time.monotonic() > self.deadline:
            return {"error": "skipped: the time budget (--budget-s) is spent"}
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # record it and go on with the next run
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def _ratio(a: dict, b: dict) -> float | None:
    """a's tok/s over b's, when both ran."""
    if a.get("tok_s") and b.get("tok_s"):
        return a["tok_s"] / b["tok_s"]
    return None


def run_e2e_bench(args, emit: Callable[[str, dict, str], None]) -> dict:
    """The e2e rows, then the KV-mode pair; `emit("e2e", result so far, line)` after each."""
    budget = Budget(args.deadline)
    modes = args.e2e_modes.split(",")
    result: dict = {"rows": [], "kv": None}
    with tempfile.TemporaryDirectory(prefix="sluice-host-") as tmp:
        work = Path(tmp)
        for model in args.e2e_models.split(","):
            specs = random_requests(args.e2e_requests, (args.e2e_input_len,) * 2,
                                    (args.e2e_output_len,) * 2, _vocab(model), seed=0)
            row: dict = {"model": model}
            result["rows"].append(row)
            step_file = str(work / f"steps-{len(result['rows'])}")
            if "offline" in modes:
                row["offline"] = budget.run(offline, model, args, specs, args.e2e_concurrency,
                                            step_file + "-offline.jsonl")
            if "served" in modes:
                row["served"] = budget.run(served, model, args, specs, args.e2e_concurrency,
                                           step_file + "-served.jsonl", work)
            row["served_over_offline"] = _ratio(row.get("served", {}), row.get("offline", {}))
            emit("e2e", result, _row_line(row))
        if args.kv_model:
            result["kv"] = kv = {"model": args.kv_model}
            specs = random_requests(args.kv_batch, (args.kv_input_len,) * 2,
                                    (args.kv_output_len,) * 2, _vocab(args.kv_model), seed=0)
            for mode in ("token", "paged"):
                kv[mode] = budget.run(offline, args.kv_model, args, specs, args.kv_batch,
                                      str(work / f"steps-kv-{mode}.jsonl"), kv=mode,
                                      overlap=True)
            kv["paged_over_token"] = _ratio(kv["paged"], kv["token"])
            emit("e2e", result, f"kv {args.kv_model}: token {_tok(kv['token'])}, paged "
                                f"{_tok(kv['paged'])}, paged/token {fmt(kv['paged_over_token'])}")
    return result


def _tok(run: dict) -> str:
    return f"{run['tok_s']:.0f} tok/s" if "tok_s" in run else run.get("error", "not run")


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _row_line(row: dict) -> str:
    parts = [f"{m} {_tok(row[m])} busy {fmt(row[m].get('steps', {}).get('busy'), '.1%')}"
             for m in ("offline", "served") if m in row]
    return f"e2e {row['model']}: " + "; ".join(parts) + (
        f"; served/offline {fmt(row['served_over_offline'])}")


def markdown(result: dict, args) -> list[str]:
    """The e2e and KV tables."""
    lines = [f"{args.e2e_requests} requests x {args.e2e_input_len} in / {args.e2e_output_len} "
             f"out, {args.e2e_concurrency} at once, greedy, ignore_eos. From SLUICE_STEP_TIMING: "
             "busy = device step time / (step time + idle gaps); worker host ms = its host time "
             "to enqueue a decode step.", "",
             "| model | offline tok/s | served tok/s | served/offline | busy offline | "
             "busy served | step ms p50 off / srv | idle gap ms p50 off / srv | "
             "worker host ms p50 off / srv |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        off, srv = row.get("offline", {}), row.get("served", {})
        so, ss = off.get("steps", {}), srv.get("steps", {})
        lines.append(
            f"| {row['model']} | {fmt(off.get('tok_s'), '.0f')} | {fmt(srv.get('tok_s'), '.0f')}"
            f" | {fmt(row.get('served_over_offline'))} | {fmt(so.get('busy'), '.1%')} | "
            f"{fmt(ss.get('busy'), '.1%')} | {fmt(so.get('step_ms_p50'), '.2f')} / "
            f"{fmt(ss.get('step_ms_p50'), '.2f')} | {fmt(so.get('gap_ms_p50'), '.3f')} / "
            f"{fmt(ss.get('gap_ms_p50'), '.3f')} | {fmt(so.get('host_ms_p50'), '.3f')} / "
            f"{fmt(ss.get('host_ms_p50'), '.3f')} |")
    errors = [f"- {row['model']} {m}: {row[m]['error']}" for row in result["rows"]
              for m in ("offline", "served") if "error" in row.get(m, {})]
    kv = result.get("kv")
    if kv:
        lines += ["", f"KV modes, offline, overlap on: {kv['model']}, {args.kv_batch} x "
                      f"{args.kv_input_len} in / {args.kv_output_len} out.", "",
                  "| model | token tok/s | paged tok/s | paged/token |", "|---|---:|---:|---:|",
                  f"| {kv['model']} | {fmt(kv['token'].get('tok_s'), '.0f')} | "
                  f"{fmt(kv['paged'].get('tok_s'), '.0f')} | {fmt(kv['paged_over_token'])} |"]
        errors += [f"- {kv['model']} {m}: {kv[m]['error']}" for m in ("token", "paged")
                   if "error" in kv[m]]
    return lines + ([""] + errors if errors else [])
