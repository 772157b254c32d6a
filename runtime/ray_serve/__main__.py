"""`python -m runtime.ray_serve`: start (or join) a Ray cluster, run the application on
Serve, and serve until SIGINT / SIGTERM; then every replica drains and stops."""

from __future__ import annotations

import logging
import sys

from runtime.config.checks import ConfigError
from runtime.procutil import StopSignals
from runtime.ray_serve.cli import PROG, parse

log = logging.getLogger("sluice.ray_serve")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [ray_serve] %(message)s",
                        datefmt="%H:%M:%S")
    try:
        import ray
        from ray import serve
    except ImportError:
        print(f"{PROG}: needs Ray Serve: pip install 'sluice[ray]'", file=sys.stderr)
        return 2
    from runtime.ray_serve.app import build_app

    try:
        cfg, opts = parse(argv)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    ray.init(address=opts.ray_address or None)
    try:
        app = build_app(cfg, opts, ray.cluster_resources().get("GPU", 0))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    stop = StopSignals()
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    try:
        serve.run(app, name=opts.app_name, route_prefix="/")
    except Exception as exc:  # the deployment failed: its replicas' errors say why
        log.error("the application did not start: %s", exc)
        serve.delete(opts.app_name)
        return 1
    log.info("serving %s on Ray Serve: http://%s:%d (%d..%d replicas)", cfg.model, cfg.host,
             cfg.port, opts.min_replicas, opts.max_replicas)
    stop.wait()
    log.info("shutting down: each replica drains its requests, then stops")
    serve.delete(opts.app_name)  # other applications on a shared cluster keep running
    return 0


if __name__ == "__main__":
    sys.exit(main())
