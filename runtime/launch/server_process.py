"""`ServerProcess`: one server process (the api, the scheduler, a worker rank) started as
a fresh interpreter.

The child runs `python -m runtime.launch.server_process NAME` and never imports the parent's
`__main__`, so a plain script may build an `Engine` without an `if __name__ ==
"__main__":` guard. Its stdin is a pipe from the parent: the first line names the entry
function and carries the `ServerConfig` (JSON). End of file after that means the parent
is gone (however it died): the child removes the server's IPC files and exits at once,
so no orphan keeps a port and nothing is left in /tmp. A child ignores SIGINT and SIGTERM
(Ctrl-C, systemd's stop and `kill -- -PGID` reach the whole process group at once): its
parent decides how it stops, and tells it with `STOP_SIGNAL` (`terminate`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config.server import ServerConfig
from runtime.procutil import STOP_SIGNAL, remove_ipc_files

Entry = Callable[[ServerConfig], None]  # a process's `run_*` function, or a partial of one
_ROOT = str(Path(os.path.abspath(__file__)).parents[2])  # the folder of `runtime`


class ServerProcess:
    """The parent's handle on one child process (the subset of `multiprocessing.Process`
    that `ProcessGroup` uses)."""

    def __init__(self, name: str, entry: Entry, cfg: ServerConfig) -> None:
        self.name = name
        self._start_line = (
            json.dumps({**_reference(entry), "config": dataclasses.asdict(cfg)}).encode() + b"\n"
        )
        self._popen: subprocess.Popen | None = None
        self.sentinel: int | None = None  # a pidfd: readable once the child has exited

    def start(self) -> None:
        # the child imports the same `runtime` as this process, wherever it came from
        path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "runtime.launch.server_process", self.name],
            stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        self.sentinel = os.pidfd_open(self._popen.pid)
        with contextlib.suppress(BrokenPipeError):  # it died at once: `exitcode` says how
            self._popen.stdin.write(self._start_line)
            self._popen.stdin.flush()  # stdin stays open: its end tells the child we are gone

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs (or before `start`); negative: killed by that signal."""
        return None if self._popen is None else self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def terminate(self) -> None:
        """Ask it to stop (`STOP_SIGNAL`): the api drains, the others exit."""
        if self.is_alive():
            self._popen.send_signal(STOP_SIGNAL)

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait until it exits, or `timeout` seconds."""
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout)

    def close(self) -> None:
        """Release the pipe and the pidfd (the child, if still running, sees its parent go)."""
        if self._popen is not None:
            self._popen.stdin.close()
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


def _reference(entry: Entry) -> dict[str, Any]:
    """How the child finds `entry`: its module, name and keyword arguments."""
    kwargs: dict[str, Any] = {}
    if isinstance(entry, functools.partial):
        entry, kwargs = entry.func, dict(entry.keywords)
    return {"entry": f"{entry.__module__}:{entry.__qualname__}", "kwargs": kwargs}


def _exit_with_parent(cfg: ServerConfig) -> None:
    """Block until stdin ends (the parent closed it, or died), then clean up and exit.

    It reads the file descriptor itself, not `sys.stdin`: a daemon thread blocked inside a
    buffered reader at interpreter exit makes the exit a fatal error."""
    while os.read(sys.stdin.fileno(), 4096):
        pass
    remove_ipc_files(cfg.ipc_dir, cfg.run_id)
    os._exit(1)


def run_child() -> None:
    """The child's side: read the start line, watch the parent, run the entry."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, signal.SIG_DFL)
    line = sys.stdin.buffer.readline()
    if not line:  # the parent died before it could say what to run
        sys.exit(1)
    start = json.loads(line)
    cfg = ServerConfig(**start["config"])
    threading.Thread(
        target=_exit_with_parent, args=(cfg,), name="parent-watch", daemon=True
    ).start()
    module, _, name = start["entry"].partition(":")
    entry = getattr(importlib.import_module(module), name)
    entry(cfg, **start["kwargs"])


if __name__ == "__main__":
    run_child()
