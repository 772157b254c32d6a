"""Groups that signal the server's processes. `sigstop`: SIGSTOP then SIGCONT of the
scheduler, the worker and the api while a stream runs (the stream must finish). `sigkill`
(each on a fresh server): SIGKILL of the api, the scheduler, the worker and the launcher;
every process must be gone, both ports closed and the IPC folder empty, within a bound.
`sigterm`: SIGTERM with streams in flight: each ends (its output, or an error event, then
[DONE]), the launcher exits 0, the IPC folder goes."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx

from tests.attack.harness import Tally, Target

EXIT_BOUND_S = 30.0
STOP_S = 3.0


def _stream_ends(target: Target, result: list, max_tokens: int = 24) -> None:
    body = {"model": target.model, "prompt": "Count: 1, 2, 3,", "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", f"{target.url}/v1/completions", json=body,
                          timeout=120) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        result.append("done" if lines and lines[-1] == "data: [DONE]" else f"cut: {lines[-1:]}")
    except httpx.HTTPError as e:
        result.append(f"error: {e!r}")


def sigstop(target: Target, tally: Tally, scale: str) -> None:
    for name in ("scheduler", "worker", "api"):
        pid = next((p for n, p in target.pids.items() if n.startswith(name)), None)
        if pid is None:
            continue
        result: list[str] = []
        stream = threading.Thread(target=_stream_ends, args=(target, result))
        stream.start()
        time.sleep(1.0)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(STOP_S)
        os.kill(pid, signal.SIGCONT)
        stream.join(180)
        if not result:
            tally.lose(f"a stream across SIGSTOP of the {name}")
        elif result[0] != "done":
            tally.fail(f"a stream across SIGSTOP of the {name}: {result[0]}")
        else:
            tally.ok()


def sigkill(model: str, log_dir: Path, tally: Tally, scale: str) -> None:
    for name in ("api", "scheduler", "worker", "launcher"):
        target = Target(model, log_dir, f"kill-{name}")
        target.start()
        pids = dict(target.pids)
        pid = target.server.proc.pid if name == "launcher" else \
            next(p for n, p in pids.items() if n.startswith(name))
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        left = _wait_gone([target.server.proc.pid, *pids.values()])
        ports = _wait_closed([target.server.port, target.server.rpc_port])
        tally.checks[f"kill_{name}_closed_s"] = round(time.monotonic() - t0, 1)
        leftovers = target.ipc_leftovers()
        if name != "launcher":
            try:
                target.server.proc.wait(EXIT_BOUND_S)
            except Exception:
                left.append(target.server.proc.pid)
        tally.checks[f"kill_{name}"] = f"left {left}, ports {ports}, ipc {leftovers}"
        if left or ports:
            tally.fail(f"SIGKILL of the {name}: processes {left} or ports {ports} left")
        elif leftovers:
            tally.fail(f"SIGKILL of the {name}: IPC files left {leftovers}")
        else:
            tally.ok()
        if target.alive:
            os.killpg(target.server.proc.pid, signal.SIGKILL)


def sigterm(model: str, log_dir: Path, tally: Tally, scale: str) -> None:
    target = Target(model, log_dir, "term")
    target.start()
    results: list[str] = []
    streams = [threading.Thread(target=_stream_ends, args=(target, results, 200))
               for _ in range(4 if scale == "full" else 2)]
    for s in streams:
        s.start()
    time.sleep(2.0)
    target.server.proc.send_signal(signal.SIGTERM)
    try:
        code = target.server.proc.wait(EXIT_BOUND_S)
    except Exception:
        code = None
    for s in streams:
        s.join(EXIT_BOUND_S)
    for r in results:
        tally.ok() if r == "done" else tally.fail(f"a stream at SIGTERM: {r}")
    tally.lost += len(streams) - len(results)
    tally.tried += len(streams) - len(results)
    leftovers = target.ipc_leftovers()
    tally.checks["exit_code"] = code
    tally.checks["ipc_left"] = leftovers
    tally.checks["tracebacks"] = target.new_tracebacks()
    if code != 0 or leftovers or tally.checks["tracebacks"]:
        tally.fail(f"SIGTERM: exit {code}, IPC files {leftovers}")


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + EXIT_BOUND_S
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _wait_closed(ports: list[int]) -> list[int]:
    """The ports still accepting connections after the bound."""
    deadline = time.monotonic() + EXIT_BOUND_S
    while (open_ := [p for p in ports if _listening(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return open_


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0
