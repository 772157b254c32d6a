"""The battery's server and bookkeeping: a `Target` (one `sluice serve` on loopback, its
process ids and IPC folder), a `Tally` per group (tried / failed / lost), and the checks
after a group: `/health`, a real generation, the KV pool back to idle, the api's RSS.

"failed": the server answered wrongly (a 5xx, a traceback in its log, a wrong reply);
"lost": a request that got no answer at all within its bound.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.serving.server_proc import SluiceServer

BATTERY_FLAGS = ["--read-timeout", "5", "--max-connections", "1024", "--max-rpc-connections",
                 "64", "--no-cache-report", "--stall-timeout", "15", "--shutdown-grace", "3",
                 "--torch-threads", "1"]
IDLE_WAIT_S = 60.0  # the KV pool must be back to idle within this after a group
MAX_NOTES = 5  # examples kept per group


@dataclass
class Tally:
    """One group's counts: `add` each attempt's outcome; `notes` keep a few examples."""

    group: str
    tried: int = 0
    failed: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)
    checks: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    def ok(self) -> None:
        self.tried += 1

    def fail(self, what: str) -> None:
        self.tried += 1
        self.failed += 1
        self._note(f"failed: {what}")

    def lose(self, what: str) -> None:
        self.tried += 1
        self.lost += 1
        self._note(f"lost: {what}")

    def _note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text[:300])

    def judge_status(self, status: int | None, what: str, expect: tuple[int, ...] = ()) -> None:
        """An HTTP answer: None is lost; a 5xx, or a status outside `expect` if given, failed."""
        if status is None:
            self.lose(what)
        elif status >= 500 or (expect and status not in expect):
            self.fail(f"{what}: HTTP {status}")
        else:
            self.ok()


class Target:
    """A `sluice serve` on loopback with the battery's flags, in a TMPDIR of its own."""

    def __init__(self, model: str, log_dir: Path, name: str, extra: list[str] = ()) -> None:
        self.tmpdir = tempfile.mkdtemp(prefix=f"attack-{name}-")
        self.server = SluiceServer(["--model", model, *BATTERY_FLAGS, *extra],
                                   log_dir / f"{name}.log", env={"TMPDIR": self.tmpdir})
        self.url = self.server.url
        self.rpc_addr = f"tcp://127.0.0.1:{self.server.rpc_port}"
        self.pids: dict[str, int] = {}
        self.model = model
        self._log_seen = 0

    def start(self, timeout: float = 300.0) -> None:
        self.server.start(timeout)
        text = self.server.log_path.read_text(errors="replace")
        if m := re.search(r"processes: (.*)", text):
            self.pids = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
        self._log_seen = len(text)
        self.model = httpx.get(f"{self.url}/v1/models", timeout=30).json()["data"][0]["id"]

    def stop(self) -> None:
        self.server.stop(grace=30)

    @property
    def alive(self) -> bool:
        return self.server.alive

    def new_tracebacks(self) -> int:
        """Tracebacks the server logged since the last call."""
        text = self.server.log_path.read_text(errors="replace")
        new, self._log_seen = text[self._log_seen:], len(text)
        return new.count("Traceback (most recent call last)")

    def ipc_leftovers(self) -> list[str]:
        return os.listdir(self.tmpdir) if os.path.isdir(self.tmpdir) else []

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {s.name: s.value for fam in text_string_to_metric_families(text)
                for s in fam.samples if not s.labels}

    def rss_mb(self, name: str = "api") -> float | None:
        try:
            status = Path(f"/proc/{self.pids[name]}/status").read_text()
        except (KeyError, OSError):
            return None
        kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        return round(kb / 1024, 1)


def generate_once(target: Target, timeout: float = 60.0) -> tuple[int | None, int]:
    """A real completion: (status, completion tokens); status None if no answer."""
    try:
        r = httpx.post(f"{target.url}/v1/completions", timeout=timeout, json={
            "model": target.model, "prompt": "The capital of France is", "max_tokens": 4,
            "temperature": 0})
    except httpx.HTTPError:
        return None, 0
    tokens = r.json().get("usage", {}).get("completion_tokens", 0) if r.status_code == 200 else 0
    return r.status_code, tokens


def after_group(target: Target, tally: Tally) -> None:
    """The checks after a group, into `tally.checks` (a failed check is noted as failed)."""
    checks = tally.checks
    checks["alive"] = target.alive
    if not target.alive:
        tally._note("the server is dead after the group")
        return
    try:
        health = httpx.get(f"{target.url}/health", timeout=30)
        checks["health"] = health.json().get("status")
    except httpx.HTTPError as e:
        checks["health"] = f"no answer ({type(e).__name__})"
    status, tokens = generate_once(target)
    checks["generation"] = f"{status}, {tokens} tokens"
    checks["kv_idle"] = _wait_idle(target)
    checks["api_rss_mb"] = target.rss_mb()
    checks["tracebacks"] = target.new_tracebacks()


def _wait_idle(target: Target) -> bool:
    """Whether the scheduler reports no request and no reserved KV slot within the bound."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while time.monotonic() < deadline:
        try:
            m = target.metrics()
        except httpx.HTTPError:
            m = {}
        if m and not m.get("sluice_num_requests_running", 1) \
                and not m.get("sluice_num_requests_waiting", 1) \
                and not m.get("sluice_kv_slots_reserved", 1):
            return True
        time.sleep(0.5)
    return False


def checks_passed(tally: Tally) -> bool:
    c = tally.checks
    return bool(c.get("alive")) and c.get("health") in ("ok", "degraded") \
        and str(c.get("generation", "")).startswith("200") and bool(c.get("kv_idle")) \
        and not c.get("tracebacks")
