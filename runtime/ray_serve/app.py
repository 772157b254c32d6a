"""The Serve application: `SluiceIngress` in front of the autoscaled `SluiceReplica`s."""

from __future__ import annotations

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.ray_serve.ingress import SluiceIngress
from runtime.ray_serve.options import RayServeOptions
from runtime.ray_serve.policy import autoscaling_config
from runtime.ray_serve.replica import SluiceReplica
from runtime.ray_serve.router import PrefixAffinityRouter
from runtime.ray_serve.server_args import check_server_config, server_argv

STOP_MARGIN_S = 15.0  # a server's stop beyond its drain: its processes exit meanwhile
PREPARE_MARGIN_S = 60.0  # a replica's start beyond ready_timeout: fetching, converting


def replica_gpus(cfg: ServerConfig, cluster_gpus: float) -> int:
    """GPUs each replica asks Ray for: its tp ranks' (0 on the CPU)."""
    if cfg.device == "cpu" or (cfg.device == "auto" and not cluster_gpus):
        return 0
    if cluster_gpus < cfg.tp:
        raise ConfigError(f"device {cfg.device}: a replica needs tp={cfg.tp} GPUs, the Ray "
                          f"cluster has {cluster_gpus:g}")
    return cfg.tp


def build_app(cfg: ServerConfig, opts: RayServeOptions, cluster_gpus: float) -> Application:
    """The application serving `cfg`'s model under `opts`' policy."""
    check_server_config(cfg)
    router = None
    if opts.prefix_routing:
        router = RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                     request_router_kwargs={"imbalance": opts.prefix_imbalance})
    replicas = serve.deployment(SluiceReplica, name="SluiceReplica").options(
        autoscaling_config=autoscaling_config(opts),
        # the server admits and queues (429 beyond --max-queue): Serve lets it
        max_ongoing_requests=cfg.max_running + cfg.max_queue,
        ray_actor_options={"num_cpus": opts.replica_cpus,
                           "num_gpus": replica_gpus(cfg, cluster_gpus)},
        graceful_shutdown_timeout_s=opts.drain_timeout_s,
        health_check_period_s=opts.health_check_period_s,
        health_check_timeout_s=opts.health_check_timeout_s,
        max_constructor_retry_count=opts.max_start_attempts,
        **({"request_router_config": router} if router else {}))
    ingress = serve.deployment(SluiceIngress, name="SluiceIngress").options(
        num_replicas=opts.ingress_replicas, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=opts.max_replicas * (cfg.max_running + cfg.max_queue))
    server = replicas.bind(server_argv(cfg), cfg.api_key,
                           cfg.ready_timeout + PREPARE_MARGIN_S,
                           cfg.shutdown_grace + STOP_MARGIN_S)
    return ingress.bind(server)
