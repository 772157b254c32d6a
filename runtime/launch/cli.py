"""The `sluice` command: `sluice serve` starts the api, scheduler and worker processes.

Every ServerConfig field is a flag of the same name (`--chunk-size`, `--kv-slots`, ...);
booleans get a `--no-` form (`--no-overlap`). Each flag's help is its field's docstring.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

from runtime.config.checks import ConfigError
from runtime.config.flags import add_field_flags, field_values
from runtime.config.server import ServerConfig
from runtime.launch.data_parallel import run_dp
from runtime.launch.server import run_server

_INTERNAL = frozenset({"ipc_dir", "run_id"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="start the server (api, scheduler, worker)",
        description="Start the api, scheduler and worker processes.",
    )
    add_field_flags(serve, ServerConfig, ServerConfig.field_docs(), _INTERNAL)
    return parser


def config_from_args(args: argparse.Namespace, **internal) -> ServerConfig:
    """The ServerConfig of the parsed flags (without `--api-key`, the key comes from
    SLUICE_API_KEY); `internal`: fields that are not flags."""
    options = field_values(ServerConfig, args, _INTERNAL)
    options["api_key"] = options.get("api_key") or os.environ.get("SLUICE_API_KEY", "")
    return ServerConfig(**options, **internal)


def main(argv: list[str] | None = None) -> None:
    """The `sluice` command."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [launch] %(message)s", datefmt="%H:%M:%S"
    )
    args = build_parser().parse_args(argv)
    # the server's IPC sockets live in a folder of its own, gone however this ends (when
    # this process is killed, its children remove it: see runtime.launch.server_process)
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
