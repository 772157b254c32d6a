"""`SluiceServer`: `python -m runtime.launch.cli serve ...` as a subprocess for benchmarks, and
what a results file says about the machine it ran on (device name, GPU memory, git revision).

The server's output goes to a log file; `start` waits until the launcher says it is
serving, the process exits, or a timeout passes (raising `ServerFailed` with the log's
tail). `stop` sends SIGTERM (the launcher stops its three processes) and kills after a
grace period.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from runtime.procutil import free_port

ROOT = Path(__file__).resolve().parents[2]


class ServerFailed(RuntimeError):
    """The server did not start, or died."""


class SluiceServer:
    """One `sluice serve` with `args`, on free ports, logging to `log_path`."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port, self.rpc_port = free_port(), free_port()
        self.cmd = [sys.executable, "-m", "runtime.launch.cli", "serve", "--host", "127.0.0.1",
                    "--port", str(self.port), "--rpc-port", str(self.rpc_port), *args]
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float) -> None:
        """Start and wait until serving; raise `ServerFailed` if it exits or takes too long."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=ROOT, env=self.env, start_new_session=True)
        while time.monotonic() - t0 < timeout:
            if self.ready():
                self.start_s = time.monotonic() - t0
                return
            if not self.alive:
                raise ServerFailed(f"server exited with {self.proc.returncode} during start-up:"
                                   f"\n{self.log_tail()}")
            time.sleep(0.25)
        self.stop()
        raise ServerFailed(f"server not serving after {timeout:.0f} s:\n{self.log_tail()}")

    def ready(self) -> bool:
        """Whether the server is serving: the launcher said so in its log."""
        return "] serving " in self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, grace: float = 30.0) -> None:
        if not self.alive:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the launcher's group
            self.proc.wait(10)


def _gpu_used_bytes() -> int | None:
    """Memory in use on GPU 0 (all processes) by nvidia-smi; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=20)
        return int(out.stdout.split()[0]) << 20 if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def wait_gpu_released(timeout: float = 30.0, below: int = 4 << 30) -> float | None:
    """After a server stopped: wait until the GPU is nearly empty, so the next server's pool
    fits; returns GiB still in use (None without a GPU)."""
    end = time.monotonic() + timeout
    while True:
        used = _gpu_used_bytes()
        if used is None or used < below or time.monotonic() > end:
            return None if used is None else used / (1 << 30)
        time.sleep(0.5)


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,"
                              "noheader"], capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return f"cpu ({platform.processor() or platform.machine()})"


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (rev + ("+dirty" if dirty else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
