"""Serving load generator: an OpenAI-compatible streaming client with `vllm bench serve` metrics.

Sends token-id prompts to `POST /v1/completions` (stream, `stream_options.include_usage`),
at most `concurrency` in flight, each released at its arrival time (all at once, Poisson,
gamma, bursts: `bench/serving/data.py`), and measures TTFT, TPOT, ITL, E2E and throughput
(`bench/serving/metrics.py`). Meanwhile it polls the server's `/metrics` and, given the
worker's `SLUICE_STEP_TIMING` file, reads its GPU idle time (`bench/serving/scrape.py`).
Every timestamp is the event loop's clock (`loop.time()`, monotonic), so the client can be
run on a loop whose clock is virtual.

Each request asks for `logprobs: 0` (chosen-token logprobs, which Sluice's sampler computes
anyway): their `tokens` list says how many tokens each SSE chunk carries, also for models
without a tokenizer, whose text is empty. `ignore_eos` makes outputs run to max_tokens;
a request with a stop length closes its stream there (the server then aborts it).

    python -m bench.serving --url http://127.0.0.1:30000 --dataset fixed --input-len 1536 \
        --output-len 512 --num-requests 100 --concurrency 50 [--request-rate 8 --burstiness 1]
        [--burst 5:2:5] [--slo ttft:2000,tpot:100] [--deadline 120] [--out PREFIX]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from tqdm import tqdm

from bench.serving.data import DATASETS, Burst, RequestSpec, arrival_times, make_dataset
from bench.serving.metrics import CANCELLED, RequestResult, finite, parse_slo, summarize
from bench.serving.scrape import Scraper, file_size, step_idle

REQUEST_TIMEOUT_S = 3600  # per request; runs are bounded by `deadline` instead


def _tokens_in(choice: dict) -> int:
    """Output tokens one streamed choice carries."""
    lp = choice.get("logprobs")
    if lp and lp.get("tokens") is not None:
        return len(lp["tokens"])
    return 1 if choice.get("text") or choice.get("finish_reason") is None else 0


async def send_request(session: aiohttp.ClientSession, url: str, model: str,
                       spec: RequestSpec, result: RequestResult, extra: dict | None = None) -> None:
    """Stream one completion into `result` (never raises, except CancelledError)."""
    body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "logprobs": 0,
            "temperature": 0.0, "ignore_eos": True, **(extra or {})}
    clock = asyncio.get_running_loop().time
    result.start = clock()
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return
            usage = None
            async for raw in resp.content:  # one SSE line at a time
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    result.error = str(obj["error"].get("message", obj["error"]))[:200]
                    return
                now = clock()
                for choice in obj.get("choices") or ():
                    result.on_chunk(now, _tokens_in(choice))
                if obj.get("usage"):
                    usage = obj["usage"]["completion_tokens"]
                if spec.stop_after is not None and result.output_len >= spec.stop_after:
                    result.stopped_early = result.ok = True
                    resp.close()  # the server sees the disconnect and aborts the request
                    return
            if usage is not None:
                result.output_len = usage
            result.ok = result.ttft is not None
            if not result.ok:
                result.error = "no output tokens"
    except asyncio.CancelledError:
        result.error = CANCELLED
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"[:200]


@dataclass
class LoadRun:
    """One run's requests and what the server reported during it."""

    results: list[RequestResult]
    duration: float
    truncated: bool  # the deadline cut it off
    server: dict = field(default_factory=dict)
    gpu_steps: dict = field(default_factory=dict)
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # /metrics

    def report(self, slo_ms: dict[str, float] | None = None) -> dict:
        return {"truncated": self.truncated, "client": summarize(self.results, self.duration,
                                                                  slo_ms),
                "server": self.server, "gpu_steps": self.gpu_steps}


async def run_load(url: str, model: str, specs: list[RequestSpec], *, concurrency: int,
                   arrivals: list[float] | None = None, deadline: float | None = None,
                   scrape_interval: float = 0.5, step_timing: str | None = None,
                   kv_bytes_per_token: int = 0, progress: bool = True, label: str = "requests",
                   extra: dict | None = None,
                   connector: aiohttp.BaseConnector | None = None) -> LoadRun:
    """Send `specs` (request i not before `arrivals[i]` s, at most `concurrency` at once);
    after `deadline` seconds cancel what is left (their streams close: the server aborts).
    `connector`: how to reach `url` (default: TCP, no connection limit)."""
    url = url.rstrip("/")
    arrivals = arrivals or [0.0] * len(specs)
    results = [RequestResult(len(s.prompt)) for s in specs]
    slots = asyncio.Semaphore(max(1, concurrency))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    clock = asyncio.get_running_loop().time
    async with aiohttp.ClientSession(connector=connector or aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as session:
        scraper = Scraper(session, url, scrape_interval)
        await scraper.start()
        offset = file_size(step_timing)
        bar = tqdm(total=len(specs), desc=label, unit="req", disable=not progress,
                   dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 5.0)
        t0 = clock()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + arrivals[i] - clock()))
            async with slots:
                await send_request(session, url, model, specs[i], results[i], extra)
            rate = sum(r.output_len for r in results) / max(clock() - t0, 1e-9)
            bar.set_postfix(out_tok_s=f"{rate:.0f}", refresh=False)
            bar.update(1)

        tasks = [asyncio.create_task(one(i)) for i in range(len(specs))]
        _, pending = await asyncio.wait(tasks, timeout=deadline)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = clock() - t0
        bar.close()
        for r in results:
            if not r.ok and not r.error:  # never sent
                r.error = CANCELLED
        await scraper.stop()
        await asyncio.sleep(0.2)  # the worker logs a step once it completed on the device
        return LoadRun(results, duration, bool(pending), scraper.summary(kv_bytes_per_token),
                       step_idle(step_timing, offset), scraper.samples)


def print_report(rep: dict, title: str = "Serving benchmark") -> None:
    """A `vllm bench serve`-style summary on stdout."""
    c = rep["client"]
    rows = [("Successful / failed / unfinished", f"{c['completed']} / {c['failed']} / "
             f"{c['unfinished']}"), ("Duration (s)", f"{c['duration_s']:.2f}"),
            ("Input / output tokens", f"{c['total_input_tokens']} / {c['total_output_tokens']}"),
            ("Request throughput (req/s)", f"{c['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{c['output_throughput']:.1f}"),
            ("Total token throughput (tok/s)", f"{c['total_token_throughput']:.1f}")]
    if "goodput" in c:
        rows.append((f"Goodput (req/s) under {c['slo_ms']}", f"{c['goodput']:.2f}"))
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                      ("e2e_ms", "E2E")):
        d = c[key]
        rows.append((f"{name} ms mean / P50 / P90 / P99",
                     " / ".join(f"{d[k]:.1f}" for k in ("mean", "p50", "p90", "p99"))))
    s = rep["server"]
    if s.get("samples"):
        eff = s["memory_efficiency_at_peak"]
        rows += [("Peak running / waiting", f"{s['peak_running']:.0f} / {s['peak_waiting']:.0f}"),
                 ("Peak KV reserved / held (slots)",
                  f"{s['peak_kv_reserved_slots']:.0f} / {s['kv_held_at_peak']:.0f}"),
                 ("Memory efficiency at peak", "n/a" if eff is None else f"{eff:.1%}"),
                 ("Retractions", f"{s['retractions']:.0f}"),
                 ("Prefix hit rate", "n/a" if s["prefix_hit_rate"] is None
                  else f"{s['prefix_hit_rate']:.1%}")]
        if s.get("peak_gpu_memory_bytes"):
            rows.append(("Peak GPU memory (GiB)", f"{s['peak_gpu_memory_bytes'] / 2**30:.2f}"))
    g = rep.get("gpu_steps") or {}
    if g.get("steps"):
        rows.append(("GPU idle between steps", f"{g['idle_fraction']:.1%} (median gap "
                                               f"{g['gap_ms_p50']:.3f} ms)"))
    width = max(len(k) for k, _ in rows)
    print(f"{'=' * 20} {title} {'=' * 20}" + ("  (TRUNCATED)" if rep["truncated"] else ""))
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _vocab(model: str, given: int) -> int:
    if given:
        return given
    if model.startswith("dummy:"):
        from runtime.model_presets import DUMMY_PRESETS

        return DUMMY_PRESETS[model.split(":", 1)[1]]["vocab_size"]
    return 32000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--model", default=None, help="default: the server's /v1/models")
    ap.add_argument("--dataset", choices=DATASETS, default="random")
    ap.add_argument("--num-requests", type=int, default=100)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128, help="max_tokens (mixed: its cap)")
    ap.add_argument("--range-ratio", type=float, default=0.0, help="random: +- this fraction")
    ap.add_argument("--max-len", type=int, default=4096, help="mixed: longest request")
    ap.add_argument("--num-prefixes", type=int, default=4)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=math.inf)
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1: Poisson")
    ap.add_argument("--burst", action="append", default=[], help="AT:SECONDS:FACTOR")
    ap.add_argument("--slo", default="", help="goodput SLOs in ms, e.g. ttft:2000,tpot:100")
    ap.add_argument("--deadline", type=float, default=None, help="cancel what is left after")
    ap.add_argument("--step-timing", default=None, help="the worker's SLUICE_STEP_TIMING file")
    ap.add_argument("--vocab", type=int, default=0, help="token ids below this (0: from model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--out", default=None, help="write PREFIX.json")
    args = ap.parse_args()
    model = args.model or _served_model(args.url)
    specs = make_dataset(args.dataset, args.num_requests, _vocab(model, args.vocab), args.seed,
                         input_len=args.input_len, output_len=args.output_len,
                         input_range=args.range_ratio, max_len=args.max_len,
                         num_prefixes=args.num_prefixes, prefix_len=args.prefix_len)
    arrivals = arrival_times(len(specs), args.request_rate, args.burstiness,
                             tuple(Burst.parse(b) for b in args.burst), args.seed)
    run = asyncio.run(run_load(args.url, model, specs, concurrency=args.concurrency,
                               arrivals=arrivals, deadline=args.deadline,
                               step_timing=args.step_timing, progress=not args.no_progress))
    rep = run.report(parse_slo(args.slo))
    rep["config"] = {k: v for k, v in vars(args).items() if k != "out"} | {"model": model}
    print_report(rep)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(finite(rep), indent=2) + "\n")


def _served_model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


if __name__ == "__main__":
    main()
