"""`python -m bench.loadtest`: the production load test of the serving articles, on one
server over HTTP (loopback: a server it starts; or `--url`).

Every request comes from the mixed-length set (30% short, 60% medium, 10% long by total
length up to `--max-len`; `bench/serving/data.py`), streamed, greedy. Three phases:

1. capacity: `--capacity-requests` sent at once, at most `--concurrency` in flight (a full
   batch, no queue): completed requests per second is the measured capacity;
2. soak: Poisson arrivals at `--soak-fraction` (0.8) of that capacity for `--soak-s`
   seconds (the same command runs 6 hours with `--soak-s 21600`), cut into `--window-s`
   windows: P99 TTFT / TPOT per window (stability over time), errors, OOMs;
3. burst: the soak's rate, then `--burst-factor` (5) times it for `--burst-s` (2) seconds,
   then the rate again: a server with admission limits (`--max-running`, `--max-queue`)
   refuses the excess with HTTP 429 and keeps serving what it admitted, instead of
   collapsing; windows of `--burst-s` show the burst and the recovery.

Errors (anything but a 429) and OOMs must be 0. Results: `<out>.json` and `<out>.md`.

`--ray` runs the same load against Sluice on Ray Serve instead (a local Ray cluster, the
replicas autoscaled by the policy of `--ray-args`, flags of `python -m runtime.ray_serve`;
or a running deployment: `--url` and `--ray-address`): each window also shows the replicas
running and starting, so a burst shows the scale-out beside the 429s.

    python -m bench.loadtest --model dummy:tiny --server-args "--device cpu" --soak-s 60
    python -m bench.loadtest --url http://10.0.0.5:30000 --soak-s 21600 --device-label H200
    python -m bench.loadtest --ray --ray-args "--target-ongoing-requests 8" --phases burst \
        --capacity-rps 5 --server-args "--device cpu"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import os
import re
import shlex
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench.loadtest.ray_target import ReplicaWatch, joined, replica_counts
from bench.loadtest.report import markdown
from bench.loadtest.windows import OOM, counts, stability, windows
from bench.outputs import write_outputs
from bench.serving.data import Burst, arrival_times, mixed_requests
from bench.serving.driver import _served_model, _vocab, run_load
from bench.serving.metrics import finite
from bench.serving.server_proc import ROOT, SluiceServer, device_name, git_rev
from runtime.procutil import free_port

OPEN_LOOP = 1 << 20  # concurrency for the timed phases: the arrivals alone pace them
_SAFE = re.compile(r"[^\w.-]+")  # what a model name may keep in a file name


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.loadtest",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="a running server; default: start one")
    ap.add_argument("--model", default="dummy:tiny", help="the server's model (started)")
    ap.add_argument("--server-args", default="", help="more `sluice serve` flags (started)")
    ap.add_argument("--max-running", type=int, default=16, help="started server's batch")
    ap.add_argument("--max-queue", type=int, default=16, help="started server's queue")
    ap.add_argument("--ray", action="store_true",
                    help="serve on Ray Serve: a local cluster, autoscaled replicas")
    ap.add_argument("--ray-args", default="",
                    help="`python -m runtime.ray_serve` policy flags (with --ray)")
    ap.add_argument("--ray-address", default="",
                    help="the Ray cluster of the deployment at --url: read its replica count")
    ap.add_argument("--ray-app", default="sluice", help="the Ray Serve application's name")
    ap.add_argument("--concurrency", type=int, default=0,
                    help="capacity phase's requests in flight (0: --max-running)")
    ap.add_argument("--max-len", type=int, default=2048, help="longest prompt + output")
    ap.add_argument("--output-len", type=int, default=64, help="max_tokens cap")
    ap.add_argument("--capacity-requests", type=int, default=64)
    ap.add_argument("--capacity-rps", type=float, default=0.0,
                    help="skip the capacity phase: this many requests/s")
    ap.add_argument("--soak-fraction", type=float, default=0.8)
    ap.add_argument("--soak-s", type=float, default=60.0)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--burst-factor", type=float, default=5.0)
    ap.add_argument("--burst-s", type=float, default=2.0)
    ap.add_argument("--burst-before-s", type=float, default=10.0)
    ap.add_argument("--burst-after-s", type=float, default=18.0)
    ap.add_argument("--drain-s", type=float, default=120.0,
                    help="after a phase's last arrival: cut off what is left")
    ap.add_argument("--phases", default="capacity,soak,burst")
    ap.add_argument("--device-label", default="", help="e.g. 'CPU, loaded'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="PREFIX of .json/.md (default: "
                    "bench/results/loadtest/<date>-loadtest-<model>)")
    return ap


def _bad(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    phases = set(args.phases.split(","))
    if not phases <= {"capacity", "soak", "burst"}:
        return f"--phases: unknown {sorted(phases - {'capacity', 'soak', 'burst'})}"
    if args.ray and args.url:
        return "--ray starts a deployment: for a running one give --url and --ray-address"
    if args.ray_address and not args.url:
        return "--ray-address needs --url (the deployment's HTTP address)"
    if "capacity" not in phases and not args.capacity_rps:
        return "--phases without capacity needs --capacity-rps"
    for name in ("soak_s", "window_s", "burst_s", "burst_factor", "soak_fraction", "max_len"):
        if not getattr(args, name) > 0:
            return f"--{name.replace('_', '-')} must be > 0"
    return None


async def _phase(url: str, model: str, specs, arrivals: list[float], concurrency: int,
                 deadline: float, window_s: float, span_s: float,
                 watch: ReplicaWatch | None) -> dict:
    run = await run_load(url, model, specs, concurrency=concurrency, arrivals=arrivals,
                         deadline=deadline, scrape_interval=1.0, progress=False)
    starts = [r.start for r in run.results if r.start]
    t0 = min(starts) if starts else 0.0
    rows = windows(run.results, run.samples, t0, window_s, span_s,
                   None if watch is None else list(watch.samples))
    errors = sorted({r.error for r in run.results if r.error and not r.ok})
    return {"duration_s": run.duration, "truncated": run.truncated, **counts(run.results),
            "client": run.report()["client"], "server": run.server, "windows": rows,
            "ttft_p99_stability": stability(rows, "ttft_p99_ms"),
            "tpot_p99_stability": stability(rows, "tpot_p99_ms"), "errors": errors[:10]}


def _poisson_until(rate: float, span_s: float, seed: int,
                   bursts: tuple[Burst, ...] = ()) -> list[float]:
    peak = rate * max([1.0, *(b.factor for b in bursts)])
    times = arrival_times(math.ceil(peak * span_s * 1.5) + 16, rate, 1.0, bursts, seed)
    return [t for t in times if t < span_s]


async def run_phases(args: argparse.Namespace, url: str, model: str,
                     watch: ReplicaWatch | None = None) -> dict:
    vocab = _vocab(model, 0)
    phases = args.phases.split(",")
    out: dict = {}
    rps = args.capacity_rps
    if "capacity" in phases:
        specs = mixed_requests(args.capacity_requests, args.max_len, args.output_len, vocab,
                               args.seed)
        cap = await _phase(url, model, specs, [0.0] * len(specs),
                           args.concurrency or args.max_running, args.drain_s * 5,
                           args.window_s, args.window_s, watch)
        rps = cap["completed"] / cap["duration_s"] if cap["duration_s"] else 0.0
        out["capacity"] = {**cap, "capacity_rps": rps}
    rate = args.soak_fraction * rps
    out["rate_rps"] = rate
    if rate <= 0:
        raise RuntimeError("the capacity phase completed nothing: no rate to soak at")
    if "soak" in phases:
        arrivals = _poisson_until(rate, args.soak_s, args.seed + 1)
        specs = mixed_requests(len(arrivals), args.max_len, args.output_len, vocab,
                               args.seed + 1)
        out["soak"] = await _phase(url, model, specs, arrivals, OPEN_LOOP,
                                   args.soak_s + args.drain_s, args.window_s, args.soak_s,
                                   watch)
    if "burst" in phases:
        burst = Burst(args.burst_before_s, args.burst_s, args.burst_factor)
        span = args.burst_before_s + args.burst_s + args.burst_after_s
        arrivals = _poisson_until(rate, span, args.seed + 2, (burst,))
        specs = mixed_requests(len(arrivals), args.max_len, args.output_len, vocab,
                               args.seed + 2)
        res = await _phase(url, model, specs, arrivals, OPEN_LOOP, span + args.drain_s,
                           args.burst_s, span, watch)
        out["burst"] = {**res, "burst_window": int(args.burst_before_s // args.burst_s),
                        "healthy_after": _health(url)}
    return out


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=10) as r:
            return r.status
    except OSError as e:
        return getattr(e, "code", 0) or 0


def _server_ooms(log: Path) -> int:
    try:
        return sum(1 for line in log.read_text(errors="replace").splitlines()
                   if OOM.search(line))
    except FileNotFoundError:
        return 0


def _target(args: argparse.Namespace, stack: contextlib.ExitStack,
            tmp: Path) -> tuple[str, SluiceServer | None, ReplicaWatch | None]:
    """The URL to load (a server or deployment started, stopped when `stack` closes), the
    server started, and the replica watch of a Ray Serve deployment."""
    server_flags = ["--model", args.model, "--max-running", str(args.max_running),
                    "--max-queue", str(args.max_queue), *shlex.split(args.server_args)]
    if args.ray:
        from runtime.ray_serve.local import serve_locally

        # set before the local cluster's processes start: its replicas and handles report
        # their load each second (Serve's default, 10 s, is longer than a burst), and its
        # workers, each replica's server with them, run at the priority of a server the
        # load test starts (Ray lowers its workers' priority by default)
        for name, value in (("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "1"),
                            ("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "1"),
                            ("RAY_worker_niceness", "0")):
            os.environ.setdefault(name, value)
        ray_flags = [*shlex.split(args.ray_args), "--app-name", args.ray_app,
                     "--host", "127.0.0.1", "--port", str(free_port())]
        url, _ = stack.enter_context(serve_locally([*server_flags, *ray_flags],
                                                   include_dashboard=False,
                                                   log_to_driver=False))
    elif args.url is None:
        server = SluiceServer(server_flags, tmp / "server.log")
        stack.callback(server.stop)
        server.start(timeout=900)
        return server.url, server, None
    else:
        url = args.url
        if not args.ray_address:
            return url, None, None
        stack.enter_context(joined(args.ray_address))
    return url, None, stack.enter_context(ReplicaWatch(args.ray_app))


def main(argv: list[str] | None = None) -> dict:
    ap = _parser()
    args = ap.parse_args(argv)
    if (problem := _bad(ap, args)) is not None:
        ap.error(problem)
    kind = "loadtest-ray" if args.ray or args.ray_address else "loadtest"
    name = f"{datetime.date.today().isoformat()}-{kind}-{_SAFE.sub('-', args.model)}"
    out = args.out or str(ROOT / "bench" / "results" / "loadtest" / name)
    meta = {"command": "python -m bench.loadtest " + shlex.join(sys.argv[1:] if argv is None
                                                                else argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S UTC"),
            "commit": git_rev(), "device": args.device_label or device_name(),
            "config": {k: v for k, v in vars(args).items() if k != "out"}}
    with tempfile.TemporaryDirectory(prefix="loadtest-") as tmp, \
            contextlib.ExitStack() as stack:
        url, server, watch = _target(args, stack, Path(tmp))
        model = _served_model(url)
        res = asyncio.run(run_phases(args, url, model, watch))
        res["model"] = model
        if server is not None:
            res["server_alive_after"] = server.alive
            res["server_log_ooms"] = _server_ooms(server.log_path)
        if watch is not None:
            res["replicas_after"] = replica_counts(watch.app)[0]
    result = finite({"meta": meta, "result": res})
    write_outputs(out, result, markdown(meta, res))
    print(markdown(meta, res))
    print(f"wrote {out}.json and {out}.md")
    return result


if __name__ == "__main__":
    main()
