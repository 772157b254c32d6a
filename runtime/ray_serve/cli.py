"""The command line of `python -m runtime.ray_serve`: every `sluice serve` flag, plus the
autoscaling policy's (RayServeOptions)."""

from __future__ import annotations

import argparse
import tempfile

from runtime.config.server import ServerConfig
from runtime.launch.cli import build_parser, config_from_args
from runtime.ray_serve.options import RayServeOptions, add_arguments, options_from_args
from runtime.ray_serve.server_args import check_server_config

PROG = "python -m runtime.ray_serve"


def policy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Serve a model on Ray Serve: one Sluice server per replica, replicas "
                    "added and removed by an autoscaling policy.",
        epilog="Every `sluice serve` flag is accepted too (see `sluice serve --help`); "
               "--host and --port are where Serve's HTTP proxy listens.")
    add_arguments(parser)
    return parser


def parse(argv: list[str] | None) -> tuple[ServerConfig, RayServeOptions]:
    """The server's config and the policy's options of `argv` (ConfigError if invalid or
    not for a replica; argparse exits on unknown flags)."""
    ours, rest = policy_parser().parse_known_args(argv)
    serve_args = build_parser().parse_args(["serve", *rest])
    # the driver starts no server: no socket folder of its own
    cfg = config_from_args(serve_args, ipc_dir=tempfile.gettempdir())
    check_server_config(cfg)
    return cfg, options_from_args(ours)
