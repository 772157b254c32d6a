"""The server's own view of a run: `/metrics` polled during it, and its step-timing log.

`Scraper` polls the Prometheus text of `/metrics` every `interval` seconds while the load
runs (plus once before and once after) and reduces the samples to:
- KV: peak slots reserved by live requests, the live tokens they held at that moment,
  fragmentation = 1 - held / reserved and memory efficiency = held / reserved (at the
  peak, and summed over all samples), peak running / waiting requests;
- counters over the run: retractions (preemptions), scheduler steps, prefix-cache hit rate
  (hit tokens / looked-up tokens), requests by outcome, HTTP errors;
- peak device memory (NVML, all processes on the GPU), where the server has a GPU.

`step_idle` reads the worker's `SLUICE_STEP_TIMING` JSONL (one line per step, written once
the step completed on the device) from a byte offset: GPU idle between steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from pathlib import Path

import aiohttp

from bench.serving.metrics import percentile


def parse_prometheus(text: str) -> dict[str, float]:
    """`name{labels} value` lines to {"name{labels}": value}; `_created` series dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        if key and not key.split("{")[0].endswith("_created"):
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def _sum_prefix(sample: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in sample.items() if k == prefix or k.startswith(prefix + "{"))


class Scraper:
    """Polls `<url>/metrics` in a task between `start()` and `stop()`."""

    def __init__(self, session: aiohttp.ClientSession, url: str, interval: float = 0.5) -> None:
        self.session = session
        self.url = url.rstrip("/") + "/metrics"
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.errors = 0
        self._task: asyncio.Task | None = None

    async def scrape(self) -> None:
        try:
            async with self.session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                text = await r.text()
            self.samples.append((asyncio.get_running_loop().time(), parse_prometheus(text)))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            self.errors += 1

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.scrape()

    async def start(self) -> None:
        await self.scrape()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.scrape()

    def summary(self, kv_bytes_per_token: int = 0) -> dict:
        """The run as the server saw it (see the module docstring); {} without samples."""
        if not self.samples:
            return {"scrape_errors": self.errors}
        first, last = self.samples[0][1], self.samples[-1][1]
        series = [s for _, s in self.samples]

        def delta(name: str) -> float:
            return _sum_prefix(last, name) - _sum_prefix(first, name)

        reserved = [s.get("sluice_kv_slots_reserved", 0.0) for s in series]
        held = [s.get("sluice_kv_tokens_held", 0.0) for s in series]
        peak_i = max(range(len(series)), key=lambda i: reserved[i])
        hit = delta("sluice_prefix_cache_hit_tokens_total")
        query = delta("sluice_prefix_cache_query_tokens_total")
        gpu = [_sum_prefix(s, "sluice_gpu_memory_used_bytes") for s in series]
        out = {
            "samples": len(series),
            "scrape_errors": self.errors,
            "kv_slots": last.get("sluice_kv_slots"),
            "peak_kv_reserved_slots": reserved[peak_i],
            "kv_held_at_peak": held[peak_i],
            "fragmentation_at_peak": 1 - held[peak_i] / reserved[peak_i] if reserved[peak_i]
            else None,
            "memory_efficiency_at_peak": held[peak_i] / reserved[peak_i] if reserved[peak_i]
            else None,
            "memory_efficiency_avg": sum(held) / sum(reserved) if sum(reserved) else None,
            "peak_kv_usage_ratio": max(s.get("sluice_kv_usage_ratio", 0.0) for s in series),
            "peak_running": max(s.get("sluice_num_requests_running", 0.0) for s in series),
            "mean_running": sum(s.get("sluice_num_requests_running", 0.0) for s in series)
            / len(series),
            "peak_waiting": max(s.get("sluice_num_requests_waiting", 0.0) for s in series),
            "retractions": delta("sluice_retractions_total"),
            "scheduler_steps": delta("sluice_scheduler_steps_total"),
            "prefix_hit_rate": hit / query if query else None,
            "generation_tokens": delta("sluice_generation_tokens_total"),
            "requests_success": delta('sluice_requests_total{outcome="success"}'),
            "requests_abort": delta('sluice_requests_total{outcome="abort"}'),
            "requests_error": delta('sluice_requests_total{outcome="error"}'),
            "http_errors": delta("sluice_http_errors_total"),
            "peak_gpu_memory_bytes": max(gpu) if any(gpu) else None,
            "degraded": any(s.get("sluice_degraded", 0.0) for s in series),
        }
        if kv_bytes_per_token:
            out["kv_bytes_per_token"] = kv_bytes_per_token
            out["peak_kv_reserved_bytes"] = reserved[peak_i] * kv_bytes_per_token
            out["kv_held_at_peak_bytes"] = held[peak_i] * kv_bytes_per_token
        return out


def file_size(path: str | Path | None) -> int:
    try:
        return Path(path).stat().st_size if path else 0
    except FileNotFoundError:
        return 0


def step_idle(path: str | Path | None, offset: int = 0) -> dict:
    """GPU idle between the steps logged after byte `offset` of a SLUICE_STEP_TIMING file.

    The first step after the offset is skipped: its gap spans the pause before the run.
    idle_fraction = sum(gaps) / (sum(gaps) + sum(step times)); gaps while the server
    waited for requests count too, so the median gap is the scheduling overhead."""
    if not path or not Path(path).exists():
        return {}
    with open(path, "rb") as f:
        f.seek(offset)
        lines = [json.loads(x) for x in f.read().splitlines() if x.strip()]
    rows = lines[1:]
    if not rows:
        return {"steps": 0}
    gaps = [r["gap_ms"] for r in rows if r.get("gap_ms") is not None]
    busy, idle = sum(r["step_ms"] for r in rows), sum(gaps)
    return {
        "steps": len(rows),
        "busy_ms": busy,
        "idle_ms": idle,
        "idle_fraction": idle / (idle + busy) if idle + busy > 0 else math.nan,
        "gap_ms_p50": percentile(gaps, 50),
        "gap_ms_p99": percentile(gaps, 99),
        "step_ms_p50": percentile([r["step_ms"] for r in rows], 50),
        "decode_batch_mean": (sum(r["batch_size"] for r in rows if r.get("decode"))
                              / max(1, sum(1 for r in rows if r.get("decode")))),
    }
