"""Helpers for the HTTP tests: a real `sluice serve` subprocess, SSE and Prometheus
parsing, and waiting on a condition with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import ServerProcess


@dataclass
class LiveServer:
    proc: ServerProcess

    @property
    def url(self) -> str:
        return self.proc.http_url

    @property
    def rpc_addr(self) -> str:
        return self.proc.rpc_addr

    @property
    def port(self) -> int:
        return self.proc.port

    @contextlib.contextmanager
    def worker_paused(self) -> Iterator[None]:
        """SIGSTOP the worker: the scheduler keeps answering but no step completes."""
        pid = self.proc.pids["worker"]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name (labels joined in: `name{k="v"}`)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def health(self) -> tuple[int, dict]:
        r = httpx.get(f"{self.url}/health", timeout=10)
        return r.status_code, r.json()


@contextlib.contextmanager
def live_server(**options: object) -> Iterator[LiveServer]:
    """`python -m runtime.launch.cli serve` with `options` as flags (`max_queue=8` ->
    `--max-queue 8`), on free ports, 2 torch threads, warnings only."""
    flags = ["--log-level", "warning"]
    for name, value in options.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    proc = ServerProcess(*flags)
    try:
        yield LiveServer(proc)
    finally:
        proc.stop()


def wait_until(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `pred` until it holds; fail after `timeout` seconds (a deadline, not a timing
    assertion: the state it waits for must come eventually)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def sse_payloads(lines: list[str]) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def sse_json(lines: list[str]) -> tuple[list[dict], bool]:
    """The JSON events of an SSE body, and whether it ended with `data: [DONE]`."""
    payloads = sse_payloads(lines)
    done = bool(payloads) and payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads if p != "[DONE]"], done
