"""`ProcessGroup`: start server processes, wait for their readiness, notice deaths, stop all."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

import zmq

from runtime.config import ServerConfig
from runtime.ipc import PullQueue, PushQueue
from runtime.messages import ProcessDied, Ready


class StartupError(RuntimeError):
    """A server process failed to start or did not report ready in time."""


class ProcessGroup:
    """The server's child processes (spawned, so CUDA and threads start clean)."""

    def __init__(self, cfg: ServerConfig, targets: dict[str, Callable[[ServerConfig], None]]):
        self.cfg = cfg
        self.ctx = zmq.Context.instance()
        self._ready: PullQueue = PullQueue(self.ctx, cfg.ipc("ready"), Ready, bind=True)
        spawn = mp.get_context("spawn")
        self.procs = {name: spawn.Process(target=fn, args=(cfg,), name=f"sluice-{name}")
                      for name, fn in targets.items()}
        self._stopping = threading.Event()
        self.died: tuple[str, int | None] | None = None

    def start(self) -> None:
        """Start every process and wait until each reports ready; raise StartupError if not."""
        for proc in self.procs.values():
            proc.start()
        waiting = set(self.procs)
        deadline = time.monotonic() + self.cfg.ready_timeout
        try:
            while waiting:
                if time.monotonic() > deadline:
                    raise StartupError(f"timed out waiting for {sorted(waiting)} to start")
                msg = self._ready.get(timeout_ms=200)
                if msg is not None:
                    if msg.error:
                        raise StartupError(f"{msg.name} failed to start: {msg.error}")
                    waiting.discard(msg.name)
                for name in waiting:
                    code = self.procs[name].exitcode
                    if code is not None:
                        raise StartupError(f"{name} exited with code {code} during start-up")
        except BaseException:
            self.stop()
            raise
        finally:
            self._ready.close()

    def watch(self, on_death: Callable[[str, int | None], None] | None = None) -> None:
        """Background thread: when a process dies unasked, tell the api and call `on_death`."""

        def run() -> None:
            sentinels = {p.sentinel: name for name, p in self.procs.items()}
            while not self._stopping.is_set():
                done = wait(list(sentinels), timeout=0.5)
                if done and not self._stopping.is_set():
                    name = sentinels[done[0]]
                    self.died = (name, self.procs[name].exitcode)
                    self.notify_api(ProcessDied(name, self.procs[name].exitcode))
                    if on_death is not None:
                        on_death(*self.died)
                    return

        threading.Thread(target=run, name="process-watch", daemon=True).start()

    def notify_api(self, msg: ProcessDied) -> None:
        q: PushQueue = PushQueue(self.ctx, self.cfg.ipc("api_in"))
        q.put(msg)
        q.sock.close(linger=1000)  # deliver before closing, but never block for long

    def wait_any(self, timeout: float | None = None) -> str | None:
        """Block until a process exits (or timeout); return its name."""
        sentinels = {p.sentinel: name for name, p in self.procs.items()}
        done = wait(list(sentinels), timeout=timeout)
        return sentinels[done[0]] if done else None

    def stop_after_notice(self, died: str, grace: float = 2.0) -> None:
        """A process died: let the api fail the requests in flight, then stop everything."""
        self.notify_api(ProcessDied(died, self.procs[died].exitcode))
        api = self.procs.get("api")
        if api is not None and died != "api":
            api.join(grace)  # the api answers its clients with errors meanwhile
        self.stop()

    def stop(self, grace: float = 5.0) -> None:
        """Terminate every process that is still alive; kill those that do not exit."""
        self._stopping.set()
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            if proc.pid is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
