"""`HealthTracker`: what `GET /health` answers, judged from scheduler stats over time.

200 `ok` while serving, 200 `degraded` while degraded mode caps requests, and 503
`unhealthy` with the reasons when a server process died, when the scheduler has not
answered a stats request for `stall_timeout` seconds, when requests are queued or running
but no step was planned for `stall_timeout` seconds ("scheduler may be blocked"), when KV
usage stayed above `kv_alert_ratio` for `kv_alert_seconds`, or when the scheduler found
its KV allocator inconsistent. 503 `starting` until the scheduler first answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runtime.config.server import ServerConfig
from runtime.wire.api_input import SchedulerStats


@dataclass(frozen=True)
class HealthReport:
    status: str  # "ok" | "degraded" | "starting" | "unhealthy"
    reasons: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def http_status(self) -> int:
        return 200 if self.status in ("ok", "degraded") else 503

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": self.reasons, **self.stats}


class HealthTracker:
    """Feed it every stats snapshot (`on_stats`); ask it for a `report` at any time."""

    def __init__(self, cfg: ServerConfig, now: float | None = None) -> None:
        self.cfg = cfg
        self.latest: SchedulerStats | None = None
        self._last_reply = time.monotonic() if now is None else now
        self._last_progress = self._last_reply  # a step was planned, or nothing to do
        self._steps = -1
        self._kv_high_since: float | None = None

    def on_stats(self, s: SchedulerStats, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.latest = s
        self._last_reply = now
        if s.num_steps != self._steps or not (s.running or s.waiting):
            self._steps = s.num_steps
            self._last_progress = now
        if s.kv_used / max(1, s.kv_total) > self.cfg.kv_alert_ratio:
            self._kv_high_since = now if self._kv_high_since is None else self._kv_high_since
        else:
            self._kv_high_since = None

    def report(self, dead: str | None = None, now: float | None = None) -> HealthReport:
        """The current verdict; `dead` is why the engine is gone, if it is."""
        now = time.monotonic() if now is None else now
        s = self.latest
        if dead is not None:
            return HealthReport("unhealthy", [dead], self._summary())
        if s is None:
            return HealthReport("starting", ["waiting for the scheduler's first stats reply"])
        reasons = []
        silent = now - self._last_reply
        if silent > self.cfg.stall_timeout:
            reasons.append(f"the scheduler has not answered for {silent:.1f}s "
                           "(scheduler may be blocked)")
        idle = now - self._last_progress
        if (s.running or s.waiting) and idle > self.cfg.stall_timeout:
            reasons.append(f"{s.waiting} requests waiting and {s.running} running but no "
                           f"scheduler step for {idle:.1f}s (scheduler may be blocked)")
        if self._kv_high_since is not None \
                and now - self._kv_high_since >= self.cfg.kv_alert_seconds:
            reasons.append(f"KV usage {s.kv_used / max(1, s.kv_total):.0%} has been above "
                           f"{self.cfg.kv_alert_ratio:.0%} for "
                           f"{now - self._kv_high_since:.1f}s")
        if s.invariant_error:
            reasons.append(f"KV allocator invariant violated: {s.invariant_error}")
        if reasons:
            return HealthReport("unhealthy", reasons, self._summary())
        if s.degraded:
            return HealthReport("degraded", [
                f"degraded mode: {s.waiting} requests waiting (from {self.cfg.degrade_waiting}); "
                f"new requests get max_tokens <= {self.cfg.degrade_max_tokens}"
                + (f", batch size <= {self.cfg.degrade_max_running}"
                   if self.cfg.degrade_max_running else "")], self._summary())
        return HealthReport("ok", [], self._summary())

    def _summary(self) -> dict[str, Any]:
        s = self.latest
        if s is None:
            return {}
        return {"running": s.running, "waiting": s.waiting,
                "kv_usage": round(s.kv_used / max(1, s.kv_total), 4), "num_steps": s.num_steps,
                "degraded": s.degraded}
