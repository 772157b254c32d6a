"""`Monitor`: the api process's view of the server: metrics, health, and the logs.

It polls `TokenizerManager.scheduler_stats()` every `stats_interval` seconds (and on each
`/metrics` or `/health` request), feeding the Prometheus metrics and the health tracker;
every `log_interval` seconds with activity it logs one throughput / KV line, and it logs
one structured line per finished request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from runtime.api.monitoring.gpu_metrics import GpuCollector
from runtime.api.monitoring.health import HealthReport, HealthTracker
from runtime.api.monitoring.metrics import Metrics
from runtime.api.rid import loggable
from runtime.api.timing import RequestRecord
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig
from runtime.wire.api_input import SchedulerStats
from runtime.wire.errors import ServerError

log = logging.getLogger("sluice.stats")
request_log = logging.getLogger("sluice.requests")


class Monitor:
    """Start it with the other fronts; `refresh` for fresh numbers, `health_report`."""

    def __init__(self, tm: TokenizerManager, cfg: ServerConfig) -> None:
        self.tm = tm
        self.cfg = cfg
        gpus = 0 if cfg.device == "cpu" else len(cfg.local_ranks)
        self.metrics = Metrics(tm.timings, GpuCollector(gpus))
        self.health = HealthTracker(cfg)
        tm.timings.listeners += [self.metrics.observe_request, log_request]
        self._task: asyncio.Task | None = None
        self._logged = (time.monotonic(), 0, 0)  # (when, prompt tokens, generation tokens)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._poll(), name="monitor")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self, timeout: float) -> None:
        """Ask the scheduler for stats (up to `timeout` s); a silent one ages the health."""
        self.metrics.limits = self.tm.limits
        try:
            stats = await asyncio.wait_for(self.tm.scheduler_stats(), timeout)
        except (asyncio.TimeoutError, ServerError):
            return
        self.metrics.observe_stats(stats)
        self.health.on_stats(stats)

    def health_report(self) -> HealthReport:
        dead = self.tm.dead
        return self.health.report(None if dead is None else str(dead))

    async def _poll(self) -> None:
        while True:
            await self.refresh(self.cfg.stall_timeout)
            if self.cfg.log_interval and \
                    time.monotonic() - self._logged[0] >= self.cfg.log_interval:
                self._log_throughput()
            await asyncio.sleep(self.cfg.stats_interval)

    def _log_throughput(self) -> None:
        now, t, s = time.monotonic(), self.tm.timings, self.health.latest
        then, prompt, gen = self._logged
        self._logged = (now, t.prompt_tokens, t.generation_tokens)
        busy = s is not None and (s.running or s.waiting)
        if s is None or not (busy or t.prompt_tokens != prompt or t.generation_tokens != gen):
            return
        dt = max(now - then, 1e-9)
        hit = s.prefix_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else 0.0
        log.info("prompt throughput %.1f tok/s, generation throughput %.1f tok/s, "
                 "running %d, waiting %d, KV usage %.1f%% (%d/%d slots), prefix hit rate "
                 "%.1f%%%s%s", (t.prompt_tokens - prompt) / dt, (t.generation_tokens - gen) / dt,
                 s.running, s.waiting, 100 * s.kv_used / max(1, s.kv_total), s.kv_used,
                 s.kv_total, 100 * hit, _host_tier(s), ", DEGRADED" if s.degraded else "")


def _host_tier(s: SchedulerStats) -> str:
    """The log line's host-tier part: usage, host hit rate, copy traffic ('' without)."""
    if not s.host_kv_total:
        return ""
    host_hit = s.host_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else 0.0
    used = 100 * s.host_kv_used / s.host_kv_total
    return (f" (host {100 * host_hit:.1f}%), host tier {used:.1f}%"
            f" ({s.host_kv_used}/{s.host_kv_total} slots), written back "
            f"{s.writeback_bytes / 1e6:.1f} MB in {s.writeback_seconds:.2f} s, loaded "
            f"{s.load_bytes / 1e6:.1f} MB in {s.load_seconds:.2f} s, swaps {s.num_swaps}")


def log_request(rec: RequestRecord) -> None:
    """One key=value line per finished request."""
    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    request_log.info("rid=%s finish=%s prompt_tokens=%d cached_tokens=%d "
                     "completion_tokens=%d queue_s=%s ttft_s=%s e2e_s=%s", loggable(rec.rid),
                     rec.outcome, rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens,
                     secs(rec.queue_time), secs(rec.ttft), secs(rec.e2e))
