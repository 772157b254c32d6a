"""`LocalServer`: one `sluice serve` as a child process on free loopback ports.

The child runs in a session of its own (its whole group can be killed) and gets SIGTERM
from the kernel if its parent dies (PR_SET_PDEATHSIG), so a replica killed outright
leaves no server behind: the server then drains for its --shutdown-grace, as for any
SIGTERM. Its output is copied to ours line by line (the replica's log); the last lines
are kept to explain a failed start.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from runtime.procutil import die_with_parent, free_port

_KEPT_LINES = 30


class ServerStartError(RuntimeError):
    """The server exited, or did not answer /health with 200, before its deadline."""


class LocalServer:
    def __init__(self, argv: list[str], api_key: str = "") -> None:
        self.port, self.rpc_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "runtime.launch.cli", "serve", *argv, "--host", "127.0.0.1",
               "--port", str(self.port), "--rpc-host", "127.0.0.1",
               "--rpc-port", str(self.rpc_port)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if api_key:
            env["SLUICE_API_KEY"] = api_key
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True,
                                     preexec_fn=functools.partial(die_with_parent, os.getpid(),
                                                                  signal.SIGTERM))
        self._last = collections.deque(maxlen=_KEPT_LINES)
        self._reader = threading.Thread(target=self._copy_output, daemon=True)
        self._reader.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _copy_output(self) -> None:
        for line in self.proc.stdout:
            self._last.append(line)
            sys.stderr.write(line)

    def last_lines(self) -> str:
        return "".join(self._last)

    def exit_code(self) -> int | None:
        """The server's exit code, None while it runs."""
        return self.proc.poll()

    async def wait_ready(self, timeout: float) -> None:
        """Return once /health answers 200; ServerStartError if the server exits first or
        `timeout` seconds pass (it is then stopped)."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as client:
            while self.exit_code() is None and time.monotonic() < deadline:
                try:
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.5)
        code = self.exit_code()
        if code is None:
            self.stop(timeout=5)
            why = f"did not become healthy within {timeout:.0f} s"
        else:
            why = f"exited with code {code}"
        self._reader.join(5)
        raise ServerStartError(f"the server {why}; its last lines:\n{self.last_lines()}")

    def stop(self, timeout: float) -> int | None:
        """SIGTERM (the server drains for its --shutdown-grace), then SIGKILL to its whole
        process group after `timeout` seconds. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode
