"""The load test against Sluice on Ray Serve: the application's replica count, sampled while
a phase runs (Serve's own status: replicas running, and replicas starting), from the local
cluster the load test started (`--ray`) or a running one (`--ray-address`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

ReplicaSample = tuple[float, int, int]  # (time.monotonic(), running, starting)
DEPLOYMENT = "SluiceReplica"


def replica_counts(app: str) -> tuple[int, int]:
    """The application's server replicas running, and starting (Serve's status)."""
    from ray import serve

    apps = serve.status().applications
    if app not in apps or DEPLOYMENT not in apps[app].deployments:
        raise RuntimeError(f"no Sluice application {app!r} on this Ray cluster (--ray-app); "
                           f"it runs: {sorted(apps)}")
    states = apps[app].deployments[DEPLOYMENT].replica_states
    return states.get("RUNNING", 0), states.get("STARTING", 0)


@contextlib.contextmanager
def joined(address: str) -> Iterator[None]:
    """Connected to the running Ray cluster at `address` (to read Serve's status)."""
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class ReplicaWatch:
    """Samples `replica_counts(app)` every `interval` seconds in a thread while entered."""

    def __init__(self, app: str, interval: float = 1.0) -> None:
        self.app, self.interval = app, interval
        self.samples: list[ReplicaSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        running, starting = replica_counts(self.app)
        self.samples.append((time.monotonic(), running, starting))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ReplicaWatch:
        self._sample()  # a wrong application fails here, before any load
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
