"""`serve_locally`: a Ray cluster of this host running the application for a block (load
tests and tests): started, deployed, and shut down with everything it ran."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import ray
from ray import serve

from runtime.ray_serve.app import build_app
from runtime.ray_serve.cli import parse
from runtime.ray_serve.options import RayServeOptions


@contextlib.contextmanager
def serve_locally(argv: list[str], **ray_init) -> Iterator[tuple[str, RayServeOptions]]:
    """A new local Ray cluster (`ray.init(**ray_init)`) serving the application of `argv`
    (flags of `python -m runtime.ray_serve`); yields its HTTP address and the policy's
    options once its first replicas run. On exit Serve and the cluster shut down (each
    replica drains, then stops its server). Unless `num_cpus` says otherwise, the cluster
    counts enough CPUs for `--max-replicas` replicas (a reservation, not a core each)."""
    cfg, opts = parse(argv)
    ray_init.setdefault("num_cpus", max(os.cpu_count() or 1,
                                        math.ceil(opts.max_replicas * opts.replica_cpus)))
    ray.init(**ray_init)
    try:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        serve.run(build_app(cfg, opts, ray.cluster_resources().get("GPU", 0)),
                  name=opts.app_name, route_prefix="/")
        yield f"http://{cfg.host}:{cfg.port}", opts
    finally:
        serve.shutdown()
        ray.shutdown()
