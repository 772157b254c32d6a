"""`run_server`: one whole server on this node (its api, scheduler and worker processes,
or, on a node other than node 0, its TP worker ranks) until a signal or a death."""

from __future__ import annotations

import logging
import signal

from runtime.config.server import ServerConfig
from runtime.launch.process_group import ProcessGroup, StartupError
from runtime.procutil import StopSignals

log = logging.getLogger("sluice.launch")


def run_server(cfg: ServerConfig, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
               ) -> int:
    """Run the server until one of `signals` (exit 0) or until a process dies (exit 1).

    On a signal the api stops first: new requests are refused, those in flight get
    `cfg.shutdown_grace` seconds to finish, the rest get an error each. A node other than
    node 0 (`--node-rank`) runs only its TP worker ranks.
    """
    from runtime.api.process import run_api
    from runtime.scheduler.loop import run_scheduler
    from runtime.worker.model_check import LOAD_ERRORS, prepare_model
    from runtime.worker.worker import worker_targets

    try:
        prepare_model(cfg)  # fetches a Hub id, converts a GGUF, before the processes need it
    except LOAD_ERRORS as exc:
        log.error("%s", exc)
        return 2
    targets = worker_targets(cfg)
    if cfg.node_rank == 0:
        targets |= {"scheduler": run_scheduler, "api": run_api}
    group = ProcessGroup(cfg, targets)
    stop = StopSignals(signals)
    try:
        group.start()
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    log.info("processes: %s", " ".join(f"{n}={p.pid}" for n, p in group.procs.items()))
    if cfg.node_rank == 0:
        api = group.info["api"]  # the addresses bound (free ports for `--port 0`)
        log.info("serving %s: %s, rpc %s", cfg.model, api["http"], api["rpc"])
    else:
        log.info("node %d of %d: TP ranks %d..%d joined %s", cfg.node_rank, cfg.nnodes,
                 cfg.local_ranks.start, cfg.local_ranks.stop - 1, cfg.dist_init_addr)
    died = None
    while not stop.is_set() and died is None:
        died = group.wait_any(timeout=0.5)
    if died is not None:
        code = group.procs[died].exitcode
        log.error("%s process exited (code %s); shutting down", died, code)
        group.stop_after_notice(died)
        return 1
    log.info("shutting down (requests in flight get %.1f s)", cfg.shutdown_grace)
    group.stop()
    return 0
