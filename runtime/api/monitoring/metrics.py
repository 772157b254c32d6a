"""Prometheus metrics of the serving process (`GET /metrics`), prometheus-client based.

Two sources: finished requests (`RequestRecord`s from the TokenizerManager's timings)
feed the counters and latency histograms as they end; the scheduler's latest
`SchedulerStats` snapshot and the running token totals are read at scrape time by a
collector. GPU utilization and memory come from NVML at scrape time (`gpu_metrics.py`).
The scheduler's `Limits` give one info-style gauge: the weight quantization and KV dtype.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from runtime.api.monitoring.gpu_metrics import GpuCollector
from runtime.api.timing import RequestRecord, RequestTimings
from runtime.wire.api_input import Limits, SchedulerStats
from runtime.wire.request_output import FinishReason

CONTENT_TYPE = CONTENT_TYPE_LATEST
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0)
LATENCY_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
OUTCOMES = {FinishReason.STOP: "success", FinishReason.LENGTH: "success",
            FinishReason.ABORT: "abort", FinishReason.ERROR: "error"}


class Metrics:
    """The registry behind `/metrics`; `observe_request` is a timings listener; `gpus`
    reads the server's GPUs at scrape time."""

    def __init__(self, timings: RequestTimings, gpus: GpuCollector) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sluice_requests", "Requests ended, by outcome "
                                "(success: stop or length; abort: client gone; error)",
                                ["outcome"], registry=r)
        self.finish_reasons = Counter("sluice_request_finish_reasons", "Requests ended, by "
                                      "finish reason", ["reason"], registry=r)
        self.http_errors = Counter("sluice_http_errors", "HTTP requests answered with an "
                                   "error status instead of output (400, 404, 429, 503, ...)",
                                   ["status"], registry=r)
        self.ttft = Histogram("sluice_time_to_first_token_seconds", "Arrival at the api to "
                              "the first output token", buckets=TTFT_BUCKETS, registry=r)
        self.itl = _BulkHistogram("sluice_inter_token_latency_seconds", "Gap between "
                                  "consecutive output tokens of a request", ITL_BUCKETS)
        r.register(self.itl)
        self.e2e = Histogram("sluice_e2e_request_latency_seconds", "Arrival at the api to the "
                             "end of the request", buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("sluice_request_queue_time_seconds", "Arrival at the scheduler "
                               "to first admission", buckets=LATENCY_BUCKETS, registry=r)
        self.snapshot: SchedulerStats | None = None
        self.limits: Limits | None = None  # the scheduler's, once they arrived
        self._collector = _StatsCollector(self, timings)
        r.register(self._collector)
        r.register(gpus)

    def observe_request(self, rec: RequestRecord) -> None:
        """Count one finished request and observe its latencies."""
        self.requests.labels(OUTCOMES.get(rec.outcome, "error")).inc()
        self.finish_reasons.labels(rec.outcome).inc()
        self.e2e.observe(rec.e2e)
        if rec.ttft is not None:
            self.ttft.observe(rec.ttft)
        if rec.queue_time is not None:
            self.queue.observe(rec.queue_time)
        self.itl.observe_many(rec.itl)

    def observe_stats(self, stats: SchedulerStats) -> None:
        """Keep the scheduler's latest snapshot for the next scrape."""
        self.snapshot = stats

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _BulkHistogram(Collector):
    """A histogram that takes a request's values at once (one per output token) for the
    cost of a bisect each, where `Histogram.observe` costs a locked update each."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.bounds = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0

    def observe_many(self, values: list[float]) -> None:
        for v in values:
            self.counts[bisect.bisect_left(self.bounds, v)] += 1  # v <= le
        self.sum += sum(values)

    def collect(self) -> Iterator[Metric]:
        cumulative = list(itertools.accumulate(self.counts))
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        yield HistogramMetricFamily(self.name, self.doc, buckets=list(zip(les, cumulative)),
                                    sum_value=self.sum)


class _StatsCollector(Collector):
    """Gauges and counters read at scrape time from the latest scheduler snapshot and the
    api's token totals."""

    def __init__(self, metrics: Metrics, timings: RequestTimings) -> None:
        self.metrics = metrics
        self.timings = timings

    def collect(self) -> Iterator[Metric]:
        t = self.timings
        yield _counter("sluice_prompt_tokens", "Prompt tokens of requests that reached the "
                       "scheduler", t.prompt_tokens)
        yield _counter("sluice_prompt_cached_tokens", "Prompt tokens served from the prefix "
                       "cache", t.cached_tokens)
        yield _counter("sluice_generation_tokens", "Output tokens generated", t.generation_tokens)
        s = self.metrics.snapshot
        if s is not None:
            yield from _stats_metrics(s)
        lim = self.metrics.limits
        if lim is not None:
            g = GaugeMetricFamily("sluice_model_format", "Always 1; the labels say how the "
                                  "worker stores the weights and the KV cache",
                                  labels=["quantization", "kv_dtype"])
            g.add_metric([lim.quantization, lim.kv_dtype], 1.0)
            yield g


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _stats_metrics(s: SchedulerStats) -> Iterator[Metric]:
    total = max(1, s.kv_total)
    yield _gauge("sluice_num_requests_running", "Requests in the running batch", s.running)
    yield _gauge("sluice_num_requests_waiting", "Requests waiting for admission", s.waiting)
    yield _gauge("sluice_kv_usage_ratio", "KV slots held by live requests / all KV slots",
                 s.kv_used / total)
    yield _gauge("sluice_kv_slots", "KV pool size in token slots", s.kv_total)
    yield _gauge("sluice_kv_slots_reserved", "KV slots reserved by live requests", s.kv_used)
    yield _gauge("sluice_kv_tokens_held", "Reserved KV slots that hold live tokens", s.kv_held)
    yield _gauge("sluice_kv_fragmentation_ratio", "1 - held / reserved KV slots",
                 1.0 - s.kv_held / s.kv_used if s.kv_used else 0.0)
    yield _gauge("sluice_kv_slots_cached", "KV slots of the prefix cache no request holds "
                 "(evictable)", s.kv_cached)
    yield _gauge("sluice_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / "
                 "prompt tokens looked up", s.prefix_hit_tokens / s.prefix_query_tokens
                 if s.prefix_query_tokens else 0.0)
    yield _gauge("sluice_degraded", "1 while degraded mode caps max_tokens and batch size",
                 float(s.degraded))
    yield _counter("sluice_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache",
                   s.prefix_hit_tokens)
    yield _counter("sluice_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix "
                   "cache", s.prefix_query_tokens)
    yield _counter("sluice_scheduler_steps", "Batches the scheduler planned", s.num_steps)
    yield _counter("sluice_retractions", "Requests retracted under KV pressure",
                   s.num_retractions)
    if s.host_kv_total:
        yield from _host_tier_metrics(s)


def _host_tier_metrics(s: SchedulerStats) -> Iterator[Metric]:
    """The host KV tier (`--host-kv-gib`): usage, copy traffic, hit rate per tier."""
    yield _gauge("sluice_host_kv_slots", "Host KV tier size in token slots", s.host_kv_total)
    yield _gauge("sluice_host_kv_usage_ratio", "Host KV slots holding a cached prefix / all "
                 "host KV slots", s.host_kv_used / s.host_kv_total)
    rate = GaugeMetricFamily("sluice_prefix_cache_tier_hit_rate", "Prompt tokens found in "
                             "one tier of the prefix cache / prompt tokens looked up",
                             labels=["tier"])
    query = max(1, s.prefix_query_tokens)
    rate.add_metric(["device"], (s.prefix_hit_tokens - s.host_hit_tokens) / query)
    rate.add_metric(["host"], s.host_hit_tokens / query)
    yield rate
    for name, doc, value in (
            ("writeback_bytes", "KV bytes written back from the device to the host tier",
             s.writeback_bytes),
            ("load_bytes", "KV bytes loaded from the host tier to the device", s.load_bytes),
            ("writeback_seconds", "Device seconds spent writing KV back to the host tier",
             s.writeback_seconds),
            ("load_seconds", "Device seconds spent loading KV from the host tier",
             s.load_seconds)):
        yield _counter(f"sluice_kv_{name}", doc, value)
    yield _counter("sluice_swaps", "Retracted requests whose KV went to the host tier "
                   "(--preempt swap)", s.num_swaps)
