"""`RayServeOptions`: the autoscaling policy's and the deployment's knobs, one frozen
dataclass validated at construction; each field is a flag of `python -m runtime.ray_serve`
of the same name (`--min-replicas`, ...), its help the field's `help` metadata."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from runtime.config.checks import ConfigError
from runtime.config.flags import add_field_flags, field_values


def _knob(default, help_: str):
    return field(default=default, metadata={"help": help_})


@dataclass(frozen=True)
class RayServeOptions:
    """How many replicas, when to add or remove one, and how each replica runs."""

    min_replicas: int = _knob(2, "Replicas kept at all times.")
    max_replicas: int = _knob(4, "The most replicas the policy may run.")
    initial_replicas: int = _knob(
        0, "Replicas the application starts with (0: min_replicas); the policy takes over "
           "from there.")
    target_ongoing_requests: float = _knob(
        32.0, "Requests in flight (running and waiting) per replica the policy aims at: "
              "more per replica adds replicas, fewer removes them.")
    queue_threshold: float = _knob(
        50.0, "Scale out while the replicas' waiting requests (mean per replica, from "
              "/metrics) stay above this.")
    upscale_utilization: float = _knob(
        0.8, "Scale out while the replicas' GPU utilization (mean, from /metrics) stays "
             "above this fraction.")
    downscale_utilization: float = _knob(
        0.4, "Scale in only while the GPU utilization stays below this fraction (and no "
             "request waits).")
    upscale_delay_s: float = _knob(
        180.0, "Seconds the policy must keep asking for more replicas before one is added.")
    downscale_delay_s: float = _knob(
        900.0, "Seconds the policy must keep asking for fewer replicas before one is removed.")
    look_back_s: float = _knob(
        30.0, "Seconds of metrics the policy averages over at each decision.")
    drain_timeout_s: float = _knob(
        600.0, "Seconds a replica being removed waits for its requests in flight to finish "
               "before its server is stopped (its streams are never cut before).")
    health_check_period_s: float = _knob(
        10.0, "Seconds between health checks of each replica (its server process and "
              "/health); a failed one replaces the replica.")
    health_check_timeout_s: float = _knob(
        30.0, "Seconds a replica's health check may take before it counts as failed.")
    replica_cpus: float = _knob(1.0, "Ray CPUs each replica reserves.")
    ingress_replicas: int = _knob(
        1, "Replicas of the HTTP ingress (they route to the server replicas).")
    prefix_routing: bool = _knob(
        True, "Send a request to the replica that served the longest prefix of its prompt, "
              "unless that replica is busier than the least busy one by prefix_imbalance.")
    prefix_imbalance: int = _knob(
        16, "Requests in flight by which the prefix's replica may exceed the least busy one "
            "and still get the request.")
    max_start_attempts: int = _knob(
        3, "Attempts to start a replica's server before the deployment is marked failed.")
    ray_address: str = _knob("", "The Ray cluster to join; empty: RAY_ADDRESS or a new "
                                 "local cluster.")
    app_name: str = _knob("sluice", "The Ray Serve application's name.")

    def __post_init__(self) -> None:
        for name in ("min_replicas", "max_replicas", "ingress_replicas", "max_start_attempts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_replicas < self.min_replicas:
            raise ConfigError(f"max_replicas ({self.max_replicas}) must be >= min_replicas "
                              f"({self.min_replicas})")
        if self.initial_replicas and not (
                self.min_replicas <= self.initial_replicas <= self.max_replicas):
            raise ConfigError(f"initial_replicas ({self.initial_replicas}) must be 0 or within "
                              f"min_replicas..max_replicas ({self.min_replicas}.."
                              f"{self.max_replicas})")
        for name in ("target_ongoing_requests", "look_back_s", "health_check_period_s",
                     "health_check_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("queue_threshold", "upscale_delay_s", "downscale_delay_s",
                     "drain_timeout_s", "replica_cpus", "prefix_imbalance"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.downscale_utilization <= self.upscale_utilization <= 1.0:
            raise ConfigError("need 0 <= downscale_utilization <= upscale_utilization <= 1, got "
                              f"{self.downscale_utilization} and {self.upscale_utilization}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per RayServeOptions field."""
    docs = {f.name: f.metadata["help"] for f in dataclasses.fields(RayServeOptions)}
    add_field_flags(parser, RayServeOptions, docs)


def options_from_args(args: argparse.Namespace) -> RayServeOptions:
    return RayServeOptions(**field_values(RayServeOptions, args))
