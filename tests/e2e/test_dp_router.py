"""`sluice serve --dp 2` behind the real sglang-router, on the CPU.

One server for the module's tests; a test that ends it takes it, and a test after it
would start another. The test that kills a replica starts its own: one replica is killed
(traffic moves to the other), then the launcher is SIGKILLed (nothing may outlive it).
No test depends on another having run.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys

import httpx
import pytest

from tests.e2e.server import (
    ServerProcess,
    free_port,
    free_port_range,
    process_alive,
    wait_for,
)

pytest.importorskip("sglang_router", reason="needs sglang-router (pip install 'sluice[router]')")

PREFIXES, PER_PREFIX = 4, 6


@pytest.fixture(scope="module")
def tmpdir_(tmp_path_factory):
    return tmp_path_factory.mktemp("dp")


def start_dp2(tmpdir, *flags: str) -> ServerProcess:
    return ServerProcess("--dp", "2", "--device", "cpu", "--torch-threads", "1",
                         "--max-running", "8", *flags, port=free_port_range(6),
                         tmpdir=str(tmpdir),
                         ready_text="behind sglang-router")


@pytest.fixture(scope="module")
def shared(tmpdir_):
    """The module's server while it lasts (started by the first test that asks for it).
    Its drain outlasts any stream a test leaves in flight when it sends SIGTERM."""
    held: list[ServerProcess] = []
    yield held
    for srv in held:
        srv.stop()


@pytest.fixture
def server(shared, tmpdir_) -> ServerProcess:
    """The module's server, whole."""
    if not shared:
        shared.append(start_dp2(tmpdir_, "--shutdown-grace", "120"))
    return shared[0]


@pytest.fixture
def taken_server(shared, server):
    """The module's server, for a test that ends it: a later test gets a new one."""
    shared.clear()
    yield server
    server.stop()


def _replica_pids(srv: ServerProcess) -> dict[str, dict[str, int]]:
    """Each replica's process pids, from its `processes:` log line."""
    out = {}
    for line in srv.lines:
        if m := re.search(r"\[(replica\d)\] INFO processes: (.*)", line):
            out[m.group(1)] = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
    return out


def _replica_urls(srv: ServerProcess) -> list[str]:
    return [f"http://127.0.0.1:{srv.port + 1 + i}" for i in range(2)]


def _served(url: str) -> int:
    """Requests replica `url` has finished (its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return int(sum(float(v) for v in re.findall(r"^sluice_requests_total\{.*\} (\S+)$", text,
                                                re.MULTILINE)))


def _complete(base: str, prompt: str) -> httpx.Response:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    return httpx.post(f"{base}/v1/completions", json=body, timeout=60)


def _workload(seed: int) -> list[tuple[int, str]]:
    """PREFIXES long prompts of random words, each asked PER_PREFIX times with another
    question at the end: (prefix index, prompt), prefix after prefix."""
    rng = random.Random(seed)
    words = ["river", "stone", "apple", "cloud", "lamp", "forest", "train", "paper", "music",
             "garden", "window", "copper", "island", "winter", "candle", "bridge"]
    out = []
    for p in range(PREFIXES):
        prefix = " ".join(rng.choice(words) for _ in range(80))
        out += [(p, f"{prefix}. Question {i}: name item {i}.") for i in range(PER_PREFIX)]
    return out


def _run(srv: ServerProcess, base: str, seed: int) -> tuple[int, list[set[int]]]:
    """Send the workload through router `base`, one request at a time: how many found
    most of their prompt cached, and which replicas served each prefix."""
    urls = _replica_urls(srv)
    hits, placed = 0, [set() for _ in range(PREFIXES)]
    for p, prompt in _workload(seed):
        before = [_served(u) for u in urls]
        r = _complete(base, prompt)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        hits += usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] // 2
        assert wait_for(lambda b=before: sum(map(_served, urls)) == sum(b) + 1, 10)
        placed[p] |= {i for i, u in enumerate(urls) if _served(u) > before[i]}
    return hits, placed


def test_requests_through_the_router_succeed(server):
    for prompt in ["The capital of France is", "Once upon a time"]:
        r = _complete(server.http_url, prompt)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 1


def test_cache_aware_keeps_a_prefix_on_one_replica_unlike_round_robin(server):
    hits, placed = _run(server, server.http_url, seed=1)
    assert all(len(replicas) == 1 for replicas in placed), placed
    assert hits == PREFIXES * (PER_PREFIX - 1)  # every request but each prefix's first

    port, metrics = free_port(), free_port()
    rr = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host",
                           "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics),
                           "--policy", "round_robin", "--log-level", "warn",
                           "--worker-urls", *_replica_urls(server)])
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _registered(base) == 2, 30)
        rr_hits, rr_placed = _run(server, base, seed=2)  # fresh prefixes: nothing cached
    finally:
        rr.terminate()
        rr.wait(10)
    assert all(len(replicas) == 2 for replicas in rr_placed), rr_placed
    assert rr_hits <= PREFIXES * (PER_PREFIX - 2) < hits  # each replica misses each prefix


def _registered(base: str) -> int:
    try:
        workers = httpx.get(f"{base}/workers", timeout=2).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return 0
    return sum(1 for w in workers if w.get("is_healthy"))


def test_a_dying_replica_then_a_killed_launcher(tmp_path):
    """Traffic moves to the other replica when one dies; SIGKILL of the launcher then
    leaves no process and no socket folder behind."""
    server = start_dp2(tmp_path)
    try:
        pids = _replica_pids(server)
        os.kill(pids["replica0"]["api"], signal.SIGKILL)
        for p, prompt in _workload(seed=1)[::PER_PREFIX] * 2:  # each prefix, wherever it was
            r = _complete(server.http_url, prompt)
            assert r.status_code == 200, (p, r.text)
        assert wait_for(lambda: "replica0 exited" in "".join(server.lines), 30)
        assert server.proc.poll() is None  # the launcher keeps serving with one replica
        assert _complete(server.http_url, "Still there?").status_code == 200

        pids = [p for procs in _replica_pids(server).values() for p in procs.values()]
        pids += list(server.pids.values())  # the replicas and the router
        assert "router" in server.pids
        server.proc.kill()
        server.proc.wait(10)
        assert wait_for(lambda: not any(process_alive(p) for p in pids), 20)
        assert wait_for(lambda: not [n for n in os.listdir(tmp_path)
                                     if n.startswith("sluice-")], 10)
    finally:
        server.stop()


def test_sigterm_to_every_process_at_once_drains_then_exits_0(taken_server):
    """systemd's KillMode=control-group: SIGTERM reaches the launcher, the replicas, their
    processes and the router at once. A stream in flight runs to its end and the launcher
    exits 0, as after a SIGTERM to it alone."""
    server = taken_server
    body = {"model": "smollm2", "prompt": "Count to fifty: 1, 2,", "max_tokens": 32,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.http_url}/v1/completions", json=body,
                      timeout=120) as r:
        events = (line.removeprefix("data: ") for line in r.iter_lines() if line)
        seen = [next(events)]
        pids = [p for procs in _replica_pids(server).values() for p in procs.values()]
        pids += list(server.pids.values())
        os.killpg(server.proc.pid, signal.SIGTERM)  # the launcher's group
        os.kill(server.pids["router"], signal.SIGTERM)  # in a session of its own
        seen += list(events)
    assert seen[-1] == "[DONE]", "".join(server.lines[-30:])
    chunks = [json.loads(e) for e in seen[:-1]]
    assert not any("error" in c for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 32
    assert server.wait(120) == 0
    assert "exited (code" not in "".join(server.lines)
    assert wait_for(lambda: not any(process_alive(p) for p in pids), 20)


@pytest.mark.gpu
def test_each_replica_runs_on_its_own_gpu(tmp_path):
    """`--dp 2` on a host of two GPUs: replica i's worker holds GPU i, and requests through
    the router succeed."""
    import pynvml
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    srv = ServerProcess("--dp", "2", "--model", "dummy:tiny", "--device", "cuda",
                        port=free_port_range(6), tmpdir=str(tmp_path),
                        ready_text="behind sglang-router")
    try:
        for i in range(4):
            body = {"model": "dummy:tiny", "prompt": [5 + i, 6, 7, 8], "max_tokens": 4,
                    "ignore_eos": True}
            r = httpx.post(f"{srv.http_url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")
        on_gpu = []
        for i in range(2):
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(visible[i])) if visible[i].isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(visible[i]))
            on_gpu.append({p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)})
        workers = [_replica_pids(srv)[f"replica{i}"]["worker"] for i in range(2)]
        assert workers[0] in on_gpu[0] and workers[0] not in on_gpu[1], (workers, on_gpu)
        assert workers[1] in on_gpu[1] and workers[1] not in on_gpu[0], (workers, on_gpu)
    finally:
        srv.stop()
