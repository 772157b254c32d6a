"""`sluice serve` stopping: SIGTERM and Ctrl-C drain, then fail what is left; a killed
launcher takes its processes and ports with it; nothing stays behind in the temp folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading

import httpx
import pytest

from runtime.client import Client
from runtime.wire.errors import ServerError, ServerTimeout
from tests.e2e.server import ServerProcess, process_alive, wait_for

LONG = dict(max_tokens=2000, ignore_eos=True, temperature=0.0)  # never ends within a test


def _assert_stopped_cleanly(srv: ServerProcess, tmp_path, wait_s: float) -> None:
    """The server exited 0 within `wait_s`, printed no traceback, and left no process and
    no IPC folder behind."""
    assert srv.wait(wait_s) == 0
    output = srv.output()
    assert "Traceback" not in output and "Fatal Python error" not in output
    assert wait_for(lambda: not any(process_alive(p) for p in srv.pids.values()), 15)
    assert _ipc_folders(tmp_path) == []


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ipc_folders(tmpdir) -> list[str]:
    return [n for n in os.listdir(tmpdir) if n.startswith("sluice-")]


def _running(srv: ServerProcess) -> int:
    health = httpx.get(f"{srv.http_url}/health", timeout=10).json()
    return health.get("running", 0) + health.get("waiting", 0)


class _InFlight:
    """Long requests of every kind, each on its own thread, recording how it ended."""

    def __init__(self, srv: ServerProcess) -> None:
        self.srv = srv
        self.sse_lines: list[str] = []
        self.whole: httpx.Response | None = None
        self.rpc_error: BaseException | None = None
        self.streaming = threading.Event()
        self.threads = [threading.Thread(target=f) for f in (self._sse, self._whole, self._rpc)]
        for t in self.threads:
            t.start()

    def _sse(self) -> None:
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Tell a story."}],
            "stream": True,
            **LONG,
        }
        with httpx.stream(
            "POST", f"{self.srv.http_url}/v1/chat/completions", json=body, timeout=120
        ) as r:
            for line in r.iter_lines():
                if line:
                    self.sse_lines.append(line)
                    self.streaming.set()

    def _whole(self) -> None:
        body = {"model": "smollm2", "prompt": "Once upon a time", **LONG}
        self.whole = httpx.post(f"{self.srv.http_url}/v1/completions", json=body, timeout=120)

    def _rpc(self) -> None:
        with Client(self.srv.rpc_addr, timeout=120) as client:
            try:
                for _ in client.generate("Tell me a long story.", stream=True, **LONG):
                    pass
            except ServerError as e:
                self.rpc_error = e

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a request never ended"

    def assert_failed_with_shutdown(self) -> None:
        events = [line.removeprefix("data: ") for line in self.sse_lines]
        assert events[-1] == "[DONE]"
        assert "shutting down" in json.loads(events[-2])["error"]["message"]
        assert self.whole is not None and self.whole.status_code == 503
        assert "shutting down" in self.whole.json()["error"]["message"]
        assert self.rpc_error is not None and not isinstance(self.rpc_error, ServerTimeout)
        assert "shutting down" in str(self.rpc_error)


@pytest.mark.parametrize("to", ["launcher", "process group"])
def test_sigterm_lets_requests_in_flight_finish_and_refuses_new_ones(tmp_path, to):
    """SIGTERM to the launcher alone, or to every process of its group at once (systemd's
    KillMode=control-group, `kill -- -PGID`): the same drain, the same exit 0."""
    srv = ServerProcess("--chunk-size", "128", "--shutdown-grace", "300", tmpdir=str(tmp_path))
    try:
        with Client(srv.rpc_addr, timeout=120) as client:
            stream = client.generate(
                "Count to fifty: 1, 2,",
                stream=True,
                max_tokens=32,
                ignore_eos=True,
                temperature=0.0,
            )
            chunks = [next(stream)]
            if to == "launcher":
                srv.proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(srv.proc.pid, signal.SIGTERM)
            assert wait_for(lambda: "shutting down:" in srv.output(0), 30)
            with (
                Client(srv.rpc_addr, timeout=60) as other,
                pytest.raises(ServerError, match="shutting down"),
            ):
                other.generate("Hello", max_tokens=4)  # new requests are refused
            assert wait_for(lambda: not _port_open(srv.port), 10)  # new connections too
            chunks += list(stream)  # the one in flight at the signal runs to its end
        assert chunks[-1].finish_reason == "length"
        assert sum(len(c.token_ids) for c in chunks) == 32
        _assert_stopped_cleanly(srv, tmp_path, 120)  # once it ended, not after the grace
        assert "process exited" not in srv.output()  # no process died before the launcher
    finally:
        srv.stop()


def test_ctrl_c_fails_requests_still_running_after_the_grace(tmp_path):
    srv = ServerProcess("--chunk-size", "128", "--shutdown-grace", "1", tmpdir=str(tmp_path))
    try:
        long = _InFlight(srv)
        assert long.streaming.wait(120)
        assert wait_for(lambda: _running(srv) >= 3, 60)
        srv.interrupt()  # every process of the group gets SIGINT, as from a terminal
        long.join(60)
        long.assert_failed_with_shutdown()
        _assert_stopped_cleanly(srv, tmp_path, 60)
    finally:
        srv.stop()


def test_killing_the_launcher_takes_every_process_and_port_with_it(tmp_path):
    srv = ServerProcess("--chunk-size", "128", tmpdir=str(tmp_path))
    try:
        assert _port_open(srv.port) and _port_open(srv.rpc_port)
        assert _ipc_folders(tmp_path) != []
        os.kill(srv.proc.pid, signal.SIGKILL)
        assert wait_for(lambda: not any(process_alive(p) for p in srv.pids.values()), 15)
        # a process's sockets close as its last thread exits, just after its pid says zombie
        assert wait_for(lambda: not _port_open(srv.port) and not _port_open(srv.rpc_port), 15)
        assert wait_for(lambda: _ipc_folders(tmp_path) == [], 5)
    finally:
        srv.stop()
        for pid in srv.pids.values():
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_storm_of_sigterms_stops_it_once_and_cleanly(tmp_path):
    """SIGTERM sent many times back to back (an orchestrator and a shell both stopping it,
    a process and its group both signalled): one drained stop, exit 0. (A signal landing
    inside the handler itself: `tests/test_stop_signals.py`.)"""
    srv = ServerProcess("--chunk-size", "128", "--shutdown-grace", "1", tmpdir=str(tmp_path))
    for _ in range(50):
        os.kill(srv.proc.pid, signal.SIGTERM)
    _assert_stopped_cleanly(srv, tmp_path, 60)
