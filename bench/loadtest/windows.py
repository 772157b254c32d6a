"""A load-test phase cut into time windows: each request by the moment it was sent, each
/metrics sample by the moment it was taken (pure functions over `RequestResult`s and the
scraper's samples, one clock: `time.perf_counter`).

A request ended one of four ways: completed (its stream ran to its end, or to the client's
own stop), shed (HTTP 429: the server's admission limit refused it, the intended answer to
an overload), failed (any other error) or unfinished (cut off by the phase's deadline). An
OOM is a failure whose message says the device or host ran out of memory.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence

from bench.serving.metrics import CANCELLED, RequestResult, percentile

OOM = re.compile(r"out of memory|OutOfMemory|\bOOM\b", re.I)
Sample = tuple[float, dict[str, float]]


def outcome(r: RequestResult) -> str:
    """completed, shed, failed or unfinished (see the module docstring)."""
    if r.ok:
        return "completed"
    if r.error.startswith("HTTP 429"):
        return "shed"
    return "unfinished" if r.error == CANCELLED else "failed"


def counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """How many requests ended each way, and the OOMs among the failures."""
    out = dict.fromkeys(("completed", "shed", "failed", "unfinished"), 0)
    for r in results:
        out[outcome(r)] += 1
    out["ooms"] = sum(1 for r in results if outcome(r) == "failed" and OOM.search(r.error))
    out["sent"] = len(results)
    return out


def _ms(values: list[float], q: float) -> float | None:
    return percentile(values, q) * 1e3 if values else None


def _series(sample: dict[str, float], name: str) -> list[float]:
    """The values of every series of family `name` in one sample (any labels)."""
    return [v for k, v in sample.items() if k == name or k.startswith(name + "{")]


def gpu_utilization(samples: Sequence[Sample]) -> list[float]:
    """Per sample with GPU gauges: the mean utilization over the server's GPUs (0..1)."""
    out = []
    for _, s in samples:
        util = _series(s, "sluice_gpu_utilization_ratio")
        if util:
            out.append(sum(util) / len(util))
    return out


def server_view(samples: Sequence[Sample]) -> dict[str, float | None]:
    """What /metrics said over some samples: queue, KV use and GPU utilization."""
    def values(name: str) -> list[float]:
        return [v for _, s in samples for v in _series(s, name)]

    running, waiting = values("sluice_num_requests_running"), values("sluice_num_requests_waiting")
    kv, util = values("sluice_kv_usage_ratio"), gpu_utilization(samples)
    return {"running_mean": statistics.fmean(running) if running else None,
            "waiting_max": max(waiting) if waiting else None,
            "kv_usage_max": max(kv) if kv else None,
            "gpu_util_mean": statistics.fmean(util) if util else None,
            "gpu_util_min": min(util) if util else None,
            "gpu_util_max": max(util) if util else None}


def replica_view(replicas: Sequence[tuple[float, int, int]]) -> dict[str, int | None]:
    """What Serve said of the replicas over some (time, running, starting) samples: the
    fewest and most running, the most starting."""
    running = [r for _, r, _ in replicas]
    return {"replicas_min": min(running) if running else None,
            "replicas_max": max(running) if running else None,
            "replicas_starting_max": max((s for _, _, s in replicas), default=None)}


def windows(results: Sequence[RequestResult], samples: Sequence[Sample], t0: float,
            window_s: float, span_s: float,
            replicas: Sequence[tuple[float, int, int]] | None = None) -> list[dict]:
    """Per `window_s` window of the phase's first `span_s` seconds from `t0`: requests sent
    in it by outcome, their P50 / P99 TTFT and P99 TPOT (ms), the server's view, and with
    `replicas` (Ray Serve's (time, running, starting) samples) the replica counts."""
    n = max(1, math.ceil(span_s / window_s - 1e-9))
    out = []
    for i in range(n):
        lo, hi = t0 + i * window_s, t0 + (i + 1) * window_s
        last = i == n - 1  # the last window also takes what was sent after span_s
        sent = [r for r in results if r.start and lo <= r.start and (last or r.start < hi)]
        done = [r for r in sent if r.ok]
        ttft = [r.ttft for r in done if r.ttft is not None]
        tpot = [t for r in done if (t := r.tpot) is not None]
        out.append({"from_s": i * window_s, "to_s": (i + 1) * window_s, **counts(sent),
                    "ttft_p50_ms": _ms(ttft, 50), "ttft_p99_ms": _ms(ttft, 99),
                    "tpot_p99_ms": _ms(tpot, 99),
                    **server_view([s for s in samples if lo <= s[0] < hi])})
        if replicas is not None:
            seen = [r for r in replicas if lo <= r[0] and (last or r[0] < hi)]
            out[-1].update(replica_view(seen))
    return out


def stability(rows: Sequence[dict], key: str) -> dict[str, float | None]:
    """How one per-window figure moved across the windows: min, max, and max / median."""
    xs = [r[key] for r in rows if r[key] is not None]
    if not xs:
        return {"min": None, "max": None, "max_over_median": None}
    mid = statistics.median(xs)
    return {"min": min(xs), "max": max(xs), "max_over_median": max(xs) / mid if mid else None}
