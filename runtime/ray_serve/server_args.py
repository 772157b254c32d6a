"""A replica's server: which `sluice serve` options a Serve replica can run, and the flags
that give its server the user's config."""

from __future__ import annotations

import dataclasses

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig

# the server flags a replica decides itself, or that Serve's replicas replace
_REPLICA_OWNED = {"host", "port", "rpc_host", "rpc_port", "api_key", "ipc_dir", "run_id",
                  "dp", "router_policy"}


def check_server_config(cfg: ServerConfig) -> None:
    """Refuse the `sluice serve` options a Serve replica cannot run (ConfigError)."""
    if cfg.dp != 1:
        raise ConfigError("dp: Ray Serve runs the replicas; use --min-replicas / "
                          "--max-replicas instead of --dp")
    if cfg.nnodes != 1:
        raise ConfigError("nnodes: a replica runs on one host (tp GPUs of one node)")


def server_argv(cfg: ServerConfig) -> list[str]:
    """The `sluice serve` flags that give a replica's server `cfg`, less what the replica
    decides itself (its ports, its sockets; the API key travels in the environment)."""
    argv = []
    for f in dataclasses.fields(ServerConfig):
        value = getattr(cfg, f.name)
        if f.name in _REPLICA_OWNED or value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, tuple):
            argv += [flag, *value]
        else:
            argv += [flag, str(value)]
    return argv
