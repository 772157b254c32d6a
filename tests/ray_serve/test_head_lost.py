"""Ray's head lost without GCS fault tolerance (its GCS and raylet killed outright, as when
the head node dies): `python -m runtime.ray_serve` exits non-zero, so a supervisor can start
it again on a new head, and no process of a replica's Sluice server is left behind.

The command runs as a user starts it, on a local cluster of its own (`dummy:tiny`, one
replica on the CPU). Ray's processes give up on a lost GCS after
`RAY_gcs_rpc_server_reconnect_timeout_s` (60 s by default; 5 s here).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.e2e.server import free_port, wait_for
from tests.ray_serve.serve_load import stream_generate

pytest.importorskip("ray.serve", reason="needs Ray Serve (pip install 'sluice[ray]')")

pytestmark = pytest.mark.slow

RECONNECT_S = 5
HEAD = re.compile(r"/gcs_server |/raylet ")  # the head's GCS and its raylet
SERVER = "runtime.launch.cli serve"


def _processes() -> dict[int, tuple[str, int, int]]:
    """Every live process: pid -> (command line, parent pid, process group)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue
        if state != "Z":
            out[int(name)] = (cmd, int(ppid), int(pgrp))
    return out


def _descendants(root: int, procs: dict[int, tuple[str, int, int]]) -> set[int]:
    found, grew = {root}, True
    while grew:
        more = {pid for pid, (_, ppid, _) in procs.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found - {root}


def test_the_head_lost_ends_the_command_and_leaves_no_server(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "RAY_gcs_rpc_server_reconnect_timeout_s": str(RECONNECT_S)}
    cmd = [sys.executable, "-m", "runtime.ray_serve", "--model", "dummy:tiny", "--device", "cpu",
           "--torch-threads", "1", "--min-replicas", "1", "--max-replicas", "1",
           "--port", str(port)]
    log = tmp_path / "command.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
    try:
        assert wait_for(lambda: "on Ray Serve" in log.read_text() or driver.poll() is not None,
                        420, poll=0.5), log.read_text()[-3000:]
        assert driver.poll() is None, log.read_text()[-3000:]
        assert stream_generate(f"http://127.0.0.1:{port}", [5, 6, 7, 8], 4).whole

        procs = _processes()
        ours = _descendants(driver.pid, procs)
        servers = {procs[p][2] for p in ours if SERVER in procs[p][0]}
        head = [p for p in ours if HEAD.search(procs[p][0])]
        assert len(servers) == 1 and len(head) == 2, [procs[p][0][:80] for p in ours]
        for pid in head:
            os.kill(pid, signal.SIGKILL)

        code = driver.wait(RECONNECT_S + 60)
        assert code != 0, log.read_text()[-3000:]

        def server_left() -> list[int]:
            return [p for p, (_, _, group) in _processes().items() if group in servers]

        assert wait_for(lambda: not server_left(), RECONNECT_S + 60, poll=0.5), server_left()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
