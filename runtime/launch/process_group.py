"""`ProcessGroup`: start server processes, wait for their readiness, notice deaths, stop all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

import zmq

from runtime.config.server import ServerConfig
from runtime.launch.server_process import Entry, ServerProcess
from runtime.procutil import remove_ipc_files
from runtime.wire.ipc import PullQueue, PushQueue
from runtime.wire.lifecycle import ProcessDied, Ready

STOP_TIMEOUT_S = 5.0  # a process told to stop gets this long (beyond the api's drain)


class StartupError(RuntimeError):
    """A server process failed to start or did not report ready in time."""


class ProcessGroup:
    """The server's child processes (fresh interpreters, so CUDA and threads start clean)."""

    def __init__(self, cfg: ServerConfig, targets: dict[str, Entry]):
        self.cfg = cfg
        self.ctx = zmq.Context.instance()
        self._ready: PullQueue = PullQueue(self.ctx, cfg.ipc("ready"), Ready, bind=True)
        self.procs = {name: ServerProcess(name, fn, cfg) for name, fn in targets.items()}
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self.died: tuple[str, int | None] | None = None
        self.info: dict[str, dict[str, str]] = {}  # what each process reported when ready

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
                    self.info[msg.name] = msg.info
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

        self._watcher = threading.Thread(target=run, name="process-watch", daemon=True)
        self._watcher.start()

    def notify_api(self, msg: ProcessDied) -> None:
        if "api" not in self.procs:  # a node that runs only worker ranks
            return
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

    def stop(self) -> None:
        """Stop every process, the api first: it refuses new requests and gives those in
        flight `cfg.shutdown_grace` seconds before failing them, while the scheduler and
        worker still run. A process that does not exit in time is killed. Then the
        server's IPC files go."""
        self._stopping.set()
        api = [p for name, p in self.procs.items() if name == "api"]
        _terminate(api, self.cfg.shutdown_grace + STOP_TIMEOUT_S)
        _terminate([p for p in self.procs.values() if p not in api], STOP_TIMEOUT_S)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()  # it waits on the sentinels closed next
        for proc in self.procs.values():
            proc.close()
        remove_ipc_files(self.cfg.ipc_dir, self.cfg.run_id)


def _terminate(procs: list[ServerProcess], timeout: float) -> None:
    """Tell each process still alive to stop; SIGKILL those still alive after `timeout` s."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
