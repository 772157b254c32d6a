"""Scaling out: tensor parallelism (over one or several hosts) and data-parallel replicas."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.checks import ConfigError, require_at_least, require_one_of

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


@dataclass(frozen=True)
class ScaleOutOptions:
    """How many processes, GPUs and hosts serve the model."""

    tp: int = 1
    """Tensor-parallel worker processes (one GPU each on CUDA, gloo on the CPU)."""
    nnodes: int = 1
    """Hosts the tensor-parallel group spans: each runs tp / nnodes worker ranks; node 0
    also runs the api and the scheduler. More than 1 needs dist_init_addr."""
    node_rank: int = 0
    """This host's place among the nnodes hosts (0: the one with the api and scheduler)."""
    dist_init_addr: str = ""
    """`host:port` of node 0, reachable from every node: torch.distributed meets at port,
    and with nnodes > 1 the scheduler serves its worker channels on the next tp + 1 ports
    of host. Empty: a file store under the ipc folder (one host)."""
    dp: int = 1
    """Data-parallel engine replicas on this host, each a whole server on its own tp GPUs
    (or, on the CPU, its own processes), behind `sglang-router` on port. Replica i serves
    HTTP on port + 1 + i and RPC on port + 1 + dp + i; the router's Prometheus metrics are
    on port + 1 + 2 * dp. 1: one server, no router."""
    router_policy: str = "cache_aware"
    """dp > 1: how sglang-router picks a replica: `cache_aware` (the replica whose cache
    likely holds the longest prefix, unless loads are unbalanced), `round_robin`,
    `random` or `power_of_two`."""

    def check_scale_out(self) -> None:
        require_at_least(self, ("tp", "nnodes", "dp"), 1)
        require_one_of(self, "router_policy", ROUTER_POLICIES)
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank must be in [0, nnodes), got {self.node_rank}")
        if self.tp % self.nnodes:
            raise ConfigError(f"nnodes ({self.nnodes}) must divide tp ({self.tp})")
        if self.nnodes > 1 and self.dp > 1:
            raise ConfigError("dp > 1 and nnodes > 1 together are not supported: run one "
                              "multi-node server per replica and a router in front")
        if self.dist_init_addr:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536 - 2 - self.tp:
                raise ConfigError(f"dist_init_addr must be host:port, got "
                                  f"{self.dist_init_addr!r}")
        elif self.nnodes > 1:
            raise ConfigError("nnodes > 1 needs dist_init_addr (node 0's host:port)")

    @property
    def multi_node(self) -> bool:
        """The scheduler and its workers meet over TCP (they may be on other hosts)."""
        return self.nnodes > 1

    @property
    def local_ranks(self) -> range:
        """The TP ranks this host runs."""
        per_node = self.tp // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)
