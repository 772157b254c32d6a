"""Monitoring: /health, /metrics and the periodic log line (api process), and degraded
mode under load."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.checks import ConfigError, require_at_least


@dataclass(frozen=True)
class MonitoringOptions:
    """How the api watches the scheduler and sheds load."""

    stats_interval: float = 1.0
    """Seconds between polls of the scheduler's stats (monitoring)."""
    log_interval: float = 10.0
    """Seconds between throughput log lines; 0: off."""
    stall_timeout: float = 30.0
    """/health answers 503 when work is queued and no scheduler step ran for this many
    seconds."""
    kv_alert_ratio: float = 0.9
    """/health answers 503 when KV usage stays above this ratio for kv_alert_seconds."""
    kv_alert_seconds: float = 30.0
    """How long KV usage must stay above kv_alert_ratio before /health answers 503."""
    degrade_waiting: int = 0
    """Degraded mode starts at this many waiting requests; 0: never degrade."""
    degrade_max_tokens: int = 128
    """Degraded mode: the max_tokens cap of requests arriving meanwhile."""
    degrade_max_running: int = 0
    """Degraded mode: the batch size cap; 0: keep max_running."""

    def check_monitoring(self) -> None:
        for name in ("stats_interval", "stall_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        require_at_least(self, ("log_interval", "kv_alert_seconds", "degrade_waiting",
                                "degrade_max_running"), 0)
        if not 0.0 < self.kv_alert_ratio <= 1.0:
            raise ConfigError(f"kv_alert_ratio must be in (0, 1], got {self.kv_alert_ratio}")
        require_at_least(self, ("degrade_max_tokens",), 1)
