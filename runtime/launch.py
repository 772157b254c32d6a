"""The `sluice` command: `sluice serve` starts the api, scheduler and worker processes.

Every ServerConfig field is a flag of the same name (`--chunk-size`, `--kv-slots`, ...);
booleans get a `--no-` form (`--no-overlap`). Each flag's help is its field's docstring.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import tempfile
import threading

from runtime.config import ConfigError, ServerConfig
from runtime.dp_launcher import run_dp
from runtime.process_group import ProcessGroup, StartupError

_INTERNAL = {"ipc_dir", "run_id"}
log = logging.getLogger("sluice.launch")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="start the server (api, scheduler, worker)",
        description="Start the api, scheduler and worker processes.",
    )
    docs = ServerConfig.field_docs()
    for f in dataclasses.fields(ServerConfig):
        if f.name in _INTERNAL:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = "auto" if f.default is None else f.default
        # argparse %-formats help strings
        text = f"{docs.get(f.name, '')} (default: {default})".replace("%", "%%").lstrip()
        if f.type in ("bool", bool, "bool | None"):  # None: decided later (`KVMode.overlap`)
            serve.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=f.default, help=text)
        elif f.type == "tuple[str, ...]":  # `--lora-paths a=/x b=/y`
            serve.add_argument(flag, dest=f.name, nargs="+", type=str, default=f.default,
                               help=text)
        else:
            typ = {"int": int, "float": float}.get(str(f.type), str)
            serve.add_argument(flag, dest=f.name, type=typ, default=f.default, help=text)
    return parser


def config_from_args(args: argparse.Namespace, **internal) -> ServerConfig:
    """The ServerConfig of the parsed flags (without `--api-key`, the key comes from
    SLUICE_API_KEY); `internal`: fields that are not flags."""
    fields = {f.name for f in dataclasses.fields(ServerConfig)} - _INTERNAL
    options = {k: tuple(v) if isinstance(v, list) else v
               for k, v in vars(args).items() if k in fields}
    options["api_key"] = options.get("api_key") or os.environ.get("SLUICE_API_KEY", "")
    return ServerConfig(**options, **internal)



def run_server(cfg: ServerConfig, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
               ) -> int:
    """Run the server until one of `signals` (exit 0) or until a process dies (exit 1).

    On a signal the api stops first: new requests are refused, those in flight get
    `cfg.shutdown_grace` seconds to finish, the rest get an error each. A node other than
    node 0 (`--node-rank`) runs only its TP worker ranks.
    """
    from runtime.api.server import run_api
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
    stop = threading.Event()
    for sig in signals:
        signal.signal(sig, lambda *_: stop.set())
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


def main(argv: list[str] | None = None) -> None:
    """The `sluice` command."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [launch] %(message)s", datefmt="%H:%M:%S"
    )
    args = build_parser().parse_args(argv)
    # the server's IPC sockets live in a folder of its own, gone however this ends (when
    # this process is killed, its children remove it: see runtime.server_process)
    with tempfile.TemporaryDirectory(prefix="sluice-", ignore_cleanup_errors=True) as ipc_dir:
        try:
            cfg = config_from_args(args, ipc_dir=ipc_dir)
        except ConfigError as exc:
            print(f"sluice: {exc}", file=sys.stderr)
            code = 2
        else:
            code = run_server(cfg) if cfg.dp == 1 else run_dp(cfg)
    sys.exit(code)


if __name__ == "__main__":
    main()
