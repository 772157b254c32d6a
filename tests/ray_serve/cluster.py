"""A local Ray cluster serving Sluice on Serve for the slow tests (CPU, `dummy:tiny`), what
they watch of it (the replicas' states, when one first began to stop), and the reference
they compare with: the same prompts on one plain `sluice serve`."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest
from ray import serve

from runtime.ray_serve.local import serve_locally
from tests.e2e.server import ServerProcess, free_port, wait_for
from tests.ray_serve.serve_load import stream_generate

SERVER_FLAGS = ["--model", "dummy:tiny", "--device", "cpu", "--torch-threads", "1"]
# metrics reach the controller each 0.5 s (Serve's default: 10 s)
FAST_METRICS = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
                "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5"}
APP = "sluice"
# the module marks of a test on a cluster: slow; the shortened look-back is below Serve's
# deprecated metrics_interval_s
MARKS = [pytest.mark.slow,
         pytest.mark.filterwarnings("ignore:`look_back_period_s`:FutureWarning")]


@contextlib.contextmanager
def serving(policy_flags: list[str]) -> Iterator[str]:
    """A local cluster running the application of SERVER_FLAGS + `policy_flags` as APP;
    yields its HTTP address once its replicas run, shuts the cluster down after."""
    saved = {k: os.environ.get(k) for k in FAST_METRICS}
    os.environ.update(FAST_METRICS)  # before ray.init: its processes inherit them
    argv = [*SERVER_FLAGS, *policy_flags, "--host", "127.0.0.1", "--port", str(free_port()),
            "--app-name", APP]
    try:
        with serve_locally(argv, num_cpus=4, include_dashboard=False,
                           object_store_memory=100 << 20, log_to_driver=False) as (url, _):
            yield url
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def replica_states(app: str = APP) -> dict[str, int]:
    """How many of the application's server replicas are in each state (RUNNING, ...)."""
    deployment = serve.status().applications[app].deployments["SluiceReplica"]
    return dict(deployment.replica_states)


class FirstStop:
    """Watches the replica states from a thread: when a replica was first seen stopping."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        if wait_for(lambda: replica_states().get("STOPPING"), 300, poll=0.05):
            self.at = time.monotonic()


def single_server_outputs(prompts: list[list[int]], max_tokens: int) -> dict[int, list[int]]:
    """Each prompt alone on a plain `sluice serve` (greedy): prompt index -> output ids."""
    srv = ServerProcess(*SERVER_FLAGS)
    out = {}
    try:
        for i, prompt in enumerate(prompts):
            one = stream_generate(srv.http_url, prompt, max_tokens, i)
            assert one.whole and len(one.output_ids) == max_tokens, one
            out[i] = one.output_ids
    finally:
        srv.stop()
    return out


class Background:
    """`fn(*args)` in a thread (the reference computed while the cluster starts)."""

    def __init__(self, fn, *args) -> None:
        self._out: list = []
        self._thread = threading.Thread(target=lambda: self._out.append(fn(*args)))
        self._thread.start()

    def result(self, timeout: float = 300.0):
        self._thread.join(timeout)
        assert self._out, "the background job failed or did not finish"
        return self._out[0]
