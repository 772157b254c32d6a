"""The serving matrix: KV modes x workloads on one model and one GPU, in one command.

    python -m bench.studies.compare [--quick | --cpu-smoke] [--gpu-memory-budget 80GiB]
                            [--time-budget S] [--out-dir bench/results] [--tag h200]
                            [--modes sglang,sglang-fp8] [--cells c100] [--sweep 50,100,800]
                            [--model dummy:deepseek-v2-lite --dtype bfloat16] [--max-running N]

For each mode a fresh `sluice serve` (`bench/serving/server_proc.py`) on the same model, a short
warm-up (Triton compiles, first prefill), then each workload through the load generator
(`bench/serving/driver.py`) with the server's `/metrics` polled and its step-timing log read:
- `sglang`: token KV + radix cache + overlap scheduling (SGLang-style);
- `paged`: vLLM-style blocks of 16, prefix caching by block hash, synchronous loop;
- `contiguous`: the seeds' "original approach", a region of prompt + max_tokens per request
  reserved at admission (as HF static batching pads every row to its full length);
- `token-no-overlap`: `sglang` with the overlap loop off;
- `sglang-fp8`: `sglang` over an fp8 KV pool (`sglang-fp8-e4m3`: without scales);
  `paged-swap`, `sglang-hicache`: with a host tier.

Workloads: a concurrency sweep (the seeds' 50 / 100 / 150 at ~2048-token sequences, one
request per client), fixed-length at the HF peers' shape (64 x 512 in / 128 out), the
seeds' mixed 30/60/10 load with early stops (variable-length streaming), long context
(chunked prefill), and few-shot shared prefixes. `bench.studies.fragmentation` (bookkeeping replay)
runs beside them for fragmentation by block size.

`--gpu-memory-budget` mirrors the seeds' A100-80GB on a bigger GPU: the KV pool gets
`(budget - weights - reserve) / KV bytes per token` slots, passed as `--kv-slots`; the bytes
per token are those of the mode's pool (fp8 with its scales for `sglang-fp8`, DeepSeek's latent
row for a `--model` of that family: `bench.studies.matrix.preset_bytes`). `--model` / `--dtype`
run the profile's workloads on another `dummy:` preset, `--sweep` sets the concurrency cells.
`--time-budget` bounds the whole matrix: each mode gets an equal share of what is left and
each workload a deadline from its weight; a cut-off workload is marked truncated, a failed
one (server died, refused) is recorded with the log's tail, and the matrix goes on. JSON and
Markdown are rewritten after every workload (`bench/studies/report.py`), the PNGs written at
the end (`bench/studies/plots.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import aiohttp

from bench.serving.data import arrival_times, make_dataset
from bench.serving.driver import run_load
from bench.serving.metrics import finite, parse_slo
from bench.serving.server_proc import (
    ROOT,
    ServerFailed,
    SluiceServer,
    device_name,
    git_rev,
    wait_gpu_released,
)
from bench.studies.matrix import (
    MODES,
    PROFILES,
    Cell,
    Profile,
    budget_kv_slots,
    customize,
    mode_kv_dtype,
    parse_bytes,
)
from bench.studies.plots import write_plots
from bench.studies.report import write_markdown

STOP_RESERVE_S = 8.0  # per mode: stopping the server
MIN_CELL_S = 4.0  # a workload with less time left than this is skipped
SCRAPE_S = 0.25  # /metrics polling period during a workload


async def warm_up(url: str, model: str, vocab: int, max_context: int, timeout: float) -> float:
    """A few requests that compile Triton kernels and touch every path (chunked prefill
    with a cached prefix, a decode batch); returns the seconds it took."""
    # odd and multiple-of-16 lengths: Triton specializes integer arguments on both
    lengths = sorted({16, 33, min(1000, max_context // 4), min(1031, max_context // 2),
                      min(9000, max_context - 64)})
    specs = [s for i, n in enumerate(lengths)
             for s in make_dataset("fixed", 1, vocab, 9000 + i, input_len=n, output_len=8)]
    specs += make_dataset("fixed", 8, vocab, 9100, input_len=64, output_len=8)
    t0 = time.perf_counter()
    run = await run_load(url, model, specs, concurrency=len(specs), deadline=timeout,
                         progress=False, scrape_interval=60)
    if not any(r.ok for r in run.results):
        raise ServerFailed(f"warm-up failed: {[r.error for r in run.results][:3]}")
    return time.perf_counter() - t0


async def wait_idle(url: str, timeout: float = 15.0) -> None:
    """Until the server runs and queues nothing (aborted requests are gone)."""
    end = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            try:
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
                busy = [ln for ln in text.splitlines() if ln.startswith(
                    ("sluice_num_requests_running ", "sluice_num_requests_waiting "))]
                if busy and all(float(ln.split()[-1]) == 0 for ln in busy):
                    return
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.2)


def run_cell(server: SluiceServer, p: Profile, cell: Cell, deadline: float, kvb: int,
             step_log: Path, seed: int, slo: dict) -> dict:
    specs = make_dataset(cell.dataset, cell.n, p.vocab, seed, input_len=cell.input_len,
                         output_len=cell.output_len, max_len=cell.max_len,
                         num_prefixes=cell.num_prefixes, prefix_len=cell.prefix_len)
    arrivals = arrival_times(len(specs), cell.rate, 1.0, (), seed)
    asyncio.run(wait_idle(server.url))
    run = asyncio.run(run_load(server.url, p.model, specs, concurrency=cell.concurrency,
                               arrivals=arrivals, deadline=deadline, step_timing=str(step_log),
                               kv_bytes_per_token=kvb, label=cell.name,
                               scrape_interval=SCRAPE_S))
    rep = run.report(slo)
    rep["cell"] = cell.describe()
    rep["deadline_s"] = deadline
    end = time.monotonic() + (3.0 if rep["client"]["failed"] else 0.0)
    while server.alive and time.monotonic() < end:  # a dying server takes a moment to exit
        time.sleep(0.1)
    if not server.alive:
        rep["error"] = f"server died during the run:\n{server.log_tail()}"
    return rep


def run_mode(mode: str, p: Profile, args, results: dict, mode_end: float, kv_slots: int,
             kvb: int, save) -> None:
    """Start the mode's server, warm it up, run the profile's workloads until `mode_end`."""
    entry = results["modes"].setdefault(mode, {"args": MODES[mode], "cells": {},
                                               "kv_slots": kv_slots, "kv_bytes_per_token": kvb})
    step_log = Path(args.work_dir) / f"{mode}-steps.jsonl"
    step_log.unlink(missing_ok=True)
    server_args = ["--model", p.model, "--dtype", p.dtype, "--device", p.device,
                   "--kv-slots", str(kv_slots), "--max-running", str(p.max_running),
                   "--log-interval", "0", *p.server_args,
                   *(a.format(host_kv_gib=p.host_kv_gib) for a in MODES[mode])]
    server = SluiceServer(server_args, Path(args.work_dir) / f"{mode}-server.log",
                          env={"SLUICE_STEP_TIMING": str(step_log)})
    entry["command"] = " ".join(server.cmd[1:])
    try:
        server.start(min(p.ready_timeout, max(90.0, (mode_end - time.monotonic()) * 0.8)))
        entry["start_s"] = server.start_s
        entry["warmup_s"] = asyncio.run(warm_up(server.url, p.model, p.vocab, p.max_context,
                                                p.warmup_timeout))
    except Exception as e:  # ServerFailed, or the warm-up's requests broke
        entry["error"] = str(e) if isinstance(e, ServerFailed) else traceback.format_exc()
        print(f"[{mode}] {entry['error']}", flush=True)
        server.stop()
        return
    slo = parse_slo(args.slo)
    try:
        cells = p.cells
        for i, cell in enumerate(cells):
            left = mode_end - time.monotonic() - STOP_RESERVE_S
            if left < MIN_CELL_S or not server.alive:
                why = "server died" if not server.alive else f"time budget ({left:.0f} s left)"
                entry["cells"][cell.name] = {"cell": cell.describe(), "skipped": why}
                continue
            share = left * cell.weight / sum(c.weight for c in cells[i:])
            deadline = share + 0.4 * (left - share)  # later workloads keep >= 60% of theirs
            print(f"[{mode}] {cell.name}: {cell.n} requests, deadline {deadline:.0f} s",
                  flush=True)
            try:
                rep = run_cell(server, p, cell, deadline, kvb, step_log, seed=100 + i, slo=slo)
            except Exception:  # a bug or a broken server must not end the matrix
                entry["cells"][cell.name] = {"cell": cell.describe(),
                                             "skipped": "error: " + traceback.format_exc()}
                print(f"[{mode}] {cell.name} failed:\n{traceback.format_exc()}", flush=True)
                save()
                continue
            entry["cells"][cell.name] = rep
            c = rep["client"]
            print(f"[{mode}] {cell.name}: {c['completed']}/{c['requests']} done in "
                  f"{c['duration_s']:.1f} s, {c['output_throughput']:.0f} out tok/s"
                  + (" TRUNCATED" if rep["truncated"] else ""), flush=True)
            save()
    finally:
        server.stop()
        entry["log_tail"] = server.log_tail(8)
        entry["gpu_used_after_stop_gib"] = wait_gpu_released()
        save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="fewer requests, shorter outputs")
    g.add_argument("--cpu-smoke", action="store_true", help="dummy:tiny on the CPU, tiny counts")
    ap.add_argument("--gpu-memory-budget", default=None, help="e.g. 80GiB: cap the KV pool as "
                    "if the GPU had this much memory (default: the profile's; given, it also "
                    "replaces the cpu-smoke profile's fixed pool)")
    ap.add_argument("--kv-slots", type=int, default=0, help="KV pool size; overrides the budget")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds for the matrix")
    ap.add_argument("--modes", default=None, help=f"subset of {','.join(MODES)}")
    ap.add_argument("--cells", default=None, help="subset of the profile's workloads")
    ap.add_argument("--sweep", default=None, help="concurrency cells, e.g. 50,100,150,800 "
                    "(replace the profile's sweep; named c<N>)")
    ap.add_argument("--model", default=None, help="a dummy: preset (default: the profile's)")
    ap.add_argument("--dtype", default=None, help="the model's dtype (default: the profile's)")
    ap.add_argument("--max-running", type=int, default=None, help="the servers' --max-running "
                    "(default: the profile's, 256)")
    ap.add_argument("--slo", default="ttft:5000,tpot:100", help="goodput SLOs (ms)")
    ap.add_argument("--out-dir", default="bench/results", help="JSON, Markdown and 4 PNGs")
    ap.add_argument("--work-dir", default=None, help="server logs, step timings, "
                    "fragmentation files (default: a new temporary folder)")
    ap.add_argument("--tag", default=None, help="file name: <date>-<tag> (default: h200 or cpu)")
    ap.add_argument("--no-fragmentation", action="store_true")
    args = ap.parse_args()
    p = PROFILES["cpu-smoke" if args.cpu_smoke else "quick" if args.quick else "full"]
    p = customize(p, args.model, args.dtype, args.max_running, args.sweep).select(args.cells)
    modes = args.modes.split(",") if args.modes else list(MODES)
    if set(modes) - set(MODES):
        raise SystemExit(f"unknown modes {sorted(set(modes) - set(MODES))}; have {list(MODES)}")
    t0 = time.monotonic()
    end = t0 + (args.time_budget or p.time_budget)
    date = datetime.date.today().isoformat()
    args.stem = f"{date}-{args.tag or ('cpu-smoke' if args.cpu_smoke else 'h200')}"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="sluice-compare-")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    budget = parse_bytes(args.gpu_memory_budget or p.gpu_memory_budget)
    budgets = {kd: budget_kv_slots(p, budget, kd) for kd in dict.fromkeys(map(mode_kv_dtype,
                                                                               modes))}
    arith = budgets.get("auto") or next(iter(budgets.values()))  # the report's: the 16-bit one
    fixed = args.kv_slots or (0 if args.gpu_memory_budget else p.kv_slots)  # the flag wins
    kv_slots = fixed or arith["kv_slots"]
    arith["used"] = "--kv-slots" if fixed else "--gpu-memory-budget"
    if not fixed and any(b["kv_slots"] < 2 for b in budgets.values()):  # 0 would mean "auto"
        raise SystemExit(f"no KV pool fits the budget: {arith['explain']}")
    frag = None
    if not args.no_fragmentation:
        frag = subprocess.Popen([sys.executable, "-m", "bench.studies.fragmentation", "--requests",
                                 str(p.frag_requests), "--out", str(work / "fragmentation")],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    results = {"meta": {
        "command": "python -m bench.studies.compare " + " ".join(sys.argv[1:]), "date": date,
        "device": device_name(), "git": git_rev(), "profile": p.name, "model": p.model,
        "dtype": p.dtype, "kv_slots": kv_slots, "kv_budget": arith, "slo_ms": parse_slo(args.slo),
        "kv_budgets": budgets,
        "time_budget_s": end - t0, "modes": modes, "work_dir": str(work)}, "modes": {}}
    prefix = out / args.stem

    def save() -> None:
        results["meta"]["elapsed_s"] = time.monotonic() - t0
        if frag is not None and frag.poll() is not None and "fragmentation" not in results:
            results["fragmentation"] = _read_json(work / "fragmentation.json")
        prefix.with_suffix(".json").write_text(json.dumps(finite(results), indent=2) + "\n")
        try:
            write_markdown(prefix.with_suffix(".md"), results)
        except Exception:
            prefix.with_suffix(".md").write_text("report failed:\n" + traceback.format_exc())

    for kd, b in budgets.items():
        print(f"KV pool ({kd}): {fixed or b['kv_slots']} slots ("
              + (b["explain"] if not fixed else "--kv-slots") + ")", flush=True)
    for i, mode in enumerate(modes):
        mode_end = time.monotonic() + (end - time.monotonic()) / (len(modes) - i)
        b = budgets[mode_kv_dtype(mode)]
        run_mode(mode, p, args, results, mode_end, fixed or b["kv_slots"],
                 b["kv_bytes_per_token"], save)
    if frag is not None and "fragmentation" not in results:
        try:
            frag.wait(max(10.0, end - time.monotonic()))
            results["fragmentation"] = _read_json(work / "fragmentation.json")
        except subprocess.TimeoutExpired as e:
            frag.kill()
            results["fragmentation"] = {"error": repr(e)}
    results["offline_peers"] = _offline_peers(out)
    save()
    try:
        write_plots(prefix, results)
    except Exception:
        print("plots failed:\n" + traceback.format_exc(), flush=True)
    print(prefix.with_suffix(".md").read_text())


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return {"error": repr(e)}


def _offline_peers(out: Path) -> dict:
    """bench/offline/driver.py's HF peer numbers, if a results file of it is at hand."""
    for d in dict.fromkeys([out, ROOT / "bench" / "results"]):
        for f in sorted(d.glob("*offline*.json"), reverse=True):
            try:
                return {"file": str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f),
                        "results": json.loads(f.read_text()).get("results", {})}
            except (OSError, json.JSONDecodeError):
                continue
    return {}


if __name__ == "__main__":
    main()
