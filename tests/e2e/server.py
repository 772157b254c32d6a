"""Start `sluice serve` as a user would (a subprocess) and wait until it says it is serving."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from runtime.procutil import free_port  # tests take it from here too

# the launcher's line once every process is ready: the HTTP and RPC addresses it bound
SERVING = re.compile(r"serving \S+: http://.*:(\d+), rpc tcp://.*:(\d+)$")


def free_port_range(n: int) -> int:
    """A port p with p .. p + n - 1 all free (for servers that take consecutive ports)."""
    for _ in range(50):
        base, socks = free_port(), []
        try:
            for p in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


class ServerProcess:
    """`python -m runtime.launch.cli serve ...`, its log lines, and the pids of its processes.

    It runs in a session of its own, as under a terminal (`interrupt` is Ctrl-C there);
    `tmpdir` is its TMPDIR, where its IPC folder goes; it is ready once it prints
    `ready_text`; `env`: variables set for it beyond ours. It binds free ports
    (`--port 0 --rpc-port 0`) and `port`, `rpc_port` are those its `serving` line names;
    a server that takes ports after its own (`--dp`) is given `port`.
    """

    def __init__(self, *args: str, ready_timeout: float = 240.0, tmpdir: str | None = None,
                 port: int | None = None, ready_text: str = "serving ",
                 env: dict[str, str] | None = None) -> None:
        self.port, self.rpc_port = port or 0, 0
        # with `port` given (`--dp`), the replicas' own `serving` lines name their ports
        self._free_ports = port is None
        self._ready_text = ready_text
        cmd = [sys.executable, "-m", "runtime.launch.cli", "serve", "--port", str(self.port),
               "--rpc-port", "0", "--torch-threads", "2", *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"TMPDIR": tmpdir} if tmpdir else {}),
               **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        self.pids: dict[str, int] = {}
        self._serving = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._serving.wait(ready_timeout):
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.lines[-40:]))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if m := re.search(r"processes: (.*)", line):
                self.pids = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
            if self._free_ports and (m := SERVING.search(line.rstrip())):
                self.port, self.rpc_port = int(m.group(1)), int(m.group(2))
            if self._ready_text in line:
                self._serving.set()

    @property
    def rpc_addr(self) -> str:
        return f"tcp://127.0.0.1:{self.rpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self, timeout: float = 30.0) -> str:
        """Everything the server printed, once all its processes are gone (or `timeout`)."""
        self._reader.join(timeout)
        return "".join(self.lines)

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to every process of the server's process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the launcher and its three processes so far."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for pid in [self.proc.pid, *self.pids.values()]:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
        return total


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(pred, timeout: float, poll: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(poll)
    return pred()


def kill_mid_stream(srv: ServerProcess, process: str, prompt, wait_s: float) -> None:
    """SIGKILL `process` of `srv` while an RPC stream of `prompt` runs, then assert what a
    user relies on: the stream fails (no hang), the server exits non-zero and every one of
    its processes is gone, each within `wait_s` seconds."""
    from runtime.client import Client
    from runtime.wire.errors import ServerError

    errors: list[BaseException] = []
    got_first = threading.Event()

    def consume() -> None:
        with Client(srv.rpc_addr, timeout=wait_s) as client:
            try:
                for _ in client.generate(prompt, stream=True, max_tokens=2000,
                                         ignore_eos=True):
                    got_first.set()
            except ServerError as exc:
                errors.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    assert got_first.wait(120)
    os.kill(srv.pids[process], signal.SIGKILL)
    t.join(wait_s)
    assert not t.is_alive() and errors, "the in-flight request did not fail"
    assert srv.wait(wait_s) != 0
    assert wait_for(lambda: all(not process_alive(p) for p in srv.pids.values()), wait_s / 2)
