"""Validation of `ServerConfig`'s option groups beyond single-field ranges: each check
raises `ConfigError` naming the field at fault."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.lora_paths import parse_lora_paths

if TYPE_CHECKING:
    from runtime.config import ServerConfig

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


class ConfigError(ValueError):
    """A server option is invalid."""


def check_lora(cfg: ServerConfig) -> None:
    """`lora_paths`: unique `name=path` entries whose names requests can use."""
    try:
        parse_lora_paths(cfg.lora_paths, cfg.model)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_exposure(cfg: ServerConfig) -> None:
    """The listening addresses, the API key and the read deadline."""
    if not cfg.host or not cfg.rpc_host:
        raise ConfigError("host and rpc_host must be set")
    if cfg.api_key and not (cfg.api_key.isascii() and cfg.api_key.isprintable()
                            and " " not in cfg.api_key):
        raise ConfigError("api_key must be printable ASCII without spaces")
    if not cfg.read_timeout > 0:
        raise ConfigError(f"read_timeout must be > 0, got {cfg.read_timeout}")


def check_scale_out(cfg: ServerConfig) -> None:
    """Data parallelism (router, replica ports) and multi-node tensor parallelism."""
    if cfg.router_policy not in ROUTER_POLICIES:
        raise ConfigError(f"router_policy must be one of {ROUTER_POLICIES}, "
                          f"got {cfg.router_policy!r}")
    if cfg.dp > 1 and cfg.port == 0:
        raise ConfigError(f"dp {cfg.dp} needs a port (the replicas take the ports after it), "
                          f"not 0")
    if cfg.dp > 1 and cfg.port + 1 + 2 * cfg.dp >= 65536:
        raise ConfigError(f"dp {cfg.dp} needs ports {cfg.port}.."
                          f"{cfg.port + 1 + 2 * cfg.dp}")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise ConfigError(f"node_rank must be in [0, nnodes), got {cfg.node_rank}")
    if cfg.tp % cfg.nnodes:
        raise ConfigError(f"nnodes ({cfg.nnodes}) must divide tp ({cfg.tp})")
    if cfg.nnodes > 1 and cfg.dp > 1:
        raise ConfigError("dp > 1 and nnodes > 1 together are not supported: run one "
                          "multi-node server per replica and a router in front")
    if cfg.dist_init_addr:
        host, _, port = cfg.dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 - 2 - cfg.tp:
            raise ConfigError(f"dist_init_addr must be host:port, got "
                              f"{cfg.dist_init_addr!r}")
    elif cfg.nnodes > 1:
        raise ConfigError("nnodes > 1 needs dist_init_addr (node 0's host:port)")


def check_monitoring(cfg: ServerConfig) -> None:
    """Stats, stall detection, KV alerts and load shedding."""
    for name in ("stats_interval", "stall_timeout"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    for name in ("log_interval", "kv_alert_seconds", "degrade_waiting",
                 "degrade_max_running"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if not 0.0 < cfg.kv_alert_ratio <= 1.0:
        raise ConfigError(f"kv_alert_ratio must be in (0, 1], got {cfg.kv_alert_ratio}")
    if cfg.degrade_max_tokens < 1:
        raise ConfigError(f"degrade_max_tokens must be >= 1, got {cfg.degrade_max_tokens}")

