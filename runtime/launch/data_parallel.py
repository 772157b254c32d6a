"""`sluice serve --dp N`: N whole servers (replicas) on this host behind `sglang-router`.

Each replica is a child process that runs `run_server` on its own ports, its own GPUs
(`tp` each, through CUDA_VISIBLE_DEVICES) and its own sockets in the shared ipc folder;
its api, scheduler and workers are its children. Once every replica answers /health,
the router starts on `port` with every replica's URL and `--policy router_policy`.

Deaths: a replica that exits is logged and not restarted (a crash would loop); the
router's health checks and retries move its traffic to the others, and the launcher
exits 1 only when no replica is left. The router exiting ends everything (it is the
port the user talks to). Hygiene: replicas watch their stdin like every server process,
the router gets SIGKILL from the kernel when the launcher dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from multiprocessing.connection import wait

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.server import run_server
from runtime.launch.server_process import ServerProcess
from runtime.procutil import STOP_SIGNAL, StopSignals, die_with_parent, setup_logging

log = logging.getLogger("sluice.launch")
STOP_TIMEOUT_S = 15.0  # beyond the drain: a replica stops its own processes meanwhile
ROUTER_HEALTH_INTERVAL_S = 2  # how often the router probes each replica's /health
ROUTER_FAILURES = 2  # failed calls in a row that take a replica out until it recovers


class RouterMissing(RuntimeError):
    """`--dp` needs the optional dependency `sglang-router`."""


def replica_config(cfg: ServerConfig, index: int) -> ServerConfig:
    """Replica `index`'s config: the user's, on loopback ports of its own."""
    return cfg.replace(dp=1, host="127.0.0.1", rpc_host="127.0.0.1", port=cfg.port + 1 + index,
                       rpc_port=cfg.port + 1 + cfg.dp + index, run_id=f"{cfg.run_id}r{index}")


def router_metrics_port(cfg: ServerConfig) -> int:
    return cfg.port + 1 + 2 * cfg.dp


def device_groups(cfg: ServerConfig) -> list[str | None]:
    """Each replica's CUDA_VISIBLE_DEVICES (its `tp` GPUs); None on the CPU."""
    if cfg.device == "cpu":
        return [None] * cfg.dp
    import torch

    if not torch.cuda.is_available():
        if cfg.device == "cuda":
            raise ConfigError("device cuda: no GPU is visible")
        return [None] * cfg.dp
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(ids) < cfg.dp * cfg.tp:
        raise ConfigError(f"dp {cfg.dp} x tp {cfg.tp} needs {cfg.dp * cfg.tp} GPUs, "
                          f"{len(ids)} visible")
    return [",".join(ids[i * cfg.tp:(i + 1) * cfg.tp]) for i in range(cfg.dp)]


def run_replica(cfg: ServerConfig, index: int, devices: str | None) -> None:
    """A replica's process: one whole server. The launcher stops it with `STOP_SIGNAL`;
    SIGTERM and Ctrl-C are the launcher's."""
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices  # before anything touches CUDA
    setup_logging(f"replica{index}", cfg.log_level)
    sys.exit(run_server(cfg, signals=(STOP_SIGNAL,)))


def router_command(cfg: ServerConfig, urls: list[str]) -> list[str]:
    """The router's command line. It logs every request at info: below debug it says
    only warnings. A replica whose connection fails ROUTER_FAILURES times in a row is
    skipped (circuit open), so a request's retries go to another replica instead of
    spending them all on a dead one (cache_aware keeps picking the replica with the
    prefix)."""
    level = "info" if cfg.log_level.lower() == "debug" else "warn"
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", cfg.host,
           "--port", str(cfg.port), "--worker-urls", *urls, "--policy", cfg.router_policy,
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(router_metrics_port(cfg)),
           "--health-check-interval-secs", str(ROUTER_HEALTH_INTERVAL_S),
           "--cb-failure-threshold", str(ROUTER_FAILURES),
           "--shutdown-grace-period-secs", str(max(1, round(cfg.shutdown_grace))),
           "--log-level", level]
    if cfg.api_key:  # the router's own calls to the replicas (their model info) need it
        cmd += ["--api-key", cfg.api_key]
    return cmd


def _get_json(url: str) -> object | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, ValueError):
        return None


def _local(host: str) -> str:
    """An address of this host to connect to a server listening on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


class DataParallel:
    """The replicas and the router of one `sluice serve --dp N`."""

    def __init__(self, cfg: ServerConfig) -> None:
        if importlib.util.find_spec("sglang_router") is None:
            raise RouterMissing("--dp needs sglang-router: pip install 'sluice[router]'")
        self.cfg = cfg
        self.replicas = {}
        for i, devices in enumerate(device_groups(cfg)):
            rcfg = replica_config(cfg, i)
            entry = functools.partial(run_replica, index=i, devices=devices)
            self.replicas[f"replica{i}"] = (rcfg, ServerProcess(f"replica{i}", entry, rcfg))
        self.router: subprocess.Popen | None = None

    def url(self, name: str) -> str:
        rcfg = self.replicas[name][0]
        return f"http://{rcfg.host}:{rcfg.port}"

    def start(self, stop: StopSignals) -> None:
        """Start the replicas, wait for each one's /health, then start the router and wait
        until it has registered them all. Raises RuntimeError if any of it fails."""
        for name, (_, proc) in self.replicas.items():
            proc.start()
            log.info("%s: pid %d, %s", name, proc.pid, self.url(name))
        deadline = time.monotonic() + self.cfg.ready_timeout
        for name, (_, proc) in self.replicas.items():
            while _get_json(self.url(name) + "/health") is None:
                self._check_start(stop, deadline, name, proc.exitcode)
        urls = [self.url(n) for n in self.replicas]
        self.router = subprocess.Popen(router_command(self.cfg, urls), start_new_session=True,
                                       preexec_fn=functools.partial(die_with_parent, os.getpid(),
                                                                    signal.SIGKILL))
        workers_url = f"http://{_local(self.cfg.host)}:{self.cfg.port}/workers"
        while not self._all_registered(_get_json(workers_url)):
            self._check_start(stop, deadline, "router", self.router.poll())

    def _all_registered(self, workers: object) -> bool:
        return (isinstance(workers, dict) and len(workers.get("workers", [])) == self.cfg.dp
                and all(w.get("is_healthy") for w in workers["workers"]))

    def _check_start(self, stop: StopSignals, deadline: float, name: str,
                     code: int | None) -> None:
        if code is not None:
            raise RuntimeError(f"{name} exited with code {code} during start-up")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {name} to start")
        if stop.wait(0.25):
            raise RuntimeError("interrupted during start-up")

    def serve(self, stop: StopSignals) -> int:
        """Until `stop` (exit 0), the router's death or the last replica's (exit 1)."""
        live = {proc.sentinel: name for name, (_, proc) in self.replicas.items()}
        router = os.pidfd_open(self.router.pid)
        try:
            while not stop.is_set():
                ready = wait([*live, router], timeout=0.5)
                if stop.is_set():  # under systemd the router got the SIGTERM too: it exits
                    break
                for fd in ready:
                    if fd == router:
                        log.error("the router exited (code %s); shutting down",
                                  self.router.poll())
                        return 1
                    name = live.pop(fd)
                    log.error("%s exited (code %s); not restarted: the router's health "
                              "checks take it out of rotation, %d replica(s) keep serving",
                              name, self.replicas[name][1].exitcode, len(live))
                    if not live:
                        return 1
            return 0
        finally:
            os.close(router)

    def stop(self) -> None:
        """The router first (it drains its requests), then every replica (each drains
        its own for `shutdown_grace` seconds); what outlives its time is killed."""
        grace = self.cfg.shutdown_grace
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            try:
                self.router.wait(grace + 5)
            except subprocess.TimeoutExpired:
                self.router.kill()
                self.router.wait()
        procs = [proc for _, proc in self.replicas.values()]
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + grace + STOP_TIMEOUT_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            proc.kill()
            proc.join(1.0)
            proc.close()

    def pids(self) -> str:
        names = [f"{n}={p.pid}" for n, (_, p) in self.replicas.items()]
        return " ".join([*names, f"router={self.router.pid}"])


def run_dp(cfg: ServerConfig) -> int:
    """Run `cfg.dp` replicas behind the router until SIGTERM or Ctrl-C (exit 0)."""
    from runtime.worker.model_check import LOAD_ERRORS, prepare_model

    try:
        prepare_model(cfg)  # fetches a Hub id, converts a GGUF, before the replicas need it
        group = DataParallel(cfg)
    except (RouterMissing, ConfigError, *LOAD_ERRORS) as exc:
        log.error("%s", exc)
        return 2
    stop = StopSignals()
    try:
        group.start(stop)
    except RuntimeError as exc:
        log.error("%s", exc)
        group.stop()
        return 1
    log.info("processes: %s", group.pids())
    log.info("serving %s on %d replicas behind sglang-router (%s): http://%s:%d; router "
             "metrics on port %d", cfg.model, cfg.dp, cfg.router_policy, cfg.host, cfg.port,
             router_metrics_port(cfg))
    code = group.serve(stop)
    log.info("shutting down (requests in flight get %.1f s)", cfg.shutdown_grace)
    group.stop()
    return code
