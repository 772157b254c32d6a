"""The scale-out options: `--dp` replicas' ports and channels, multi-node TP addresses,
and the clear errors of combinations that cannot work."""

from __future__ import annotations

import pytest

from runtime import Engine
from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.data_parallel import replica_config, router_command, router_metrics_port


def test_replicas_get_consecutive_loopback_ports_and_sockets_of_their_own():
    cfg = ServerConfig(dp=2, port=40000, host="0.0.0.0")
    replicas = [replica_config(cfg, i) for i in range(2)]
    assert [(r.port, r.rpc_port) for r in replicas] == [(40001, 40003), (40002, 40004)]
    assert router_metrics_port(cfg) == 40005
    assert all(r.dp == 1 and r.host == "127.0.0.1" and r.ipc_dir == cfg.ipc_dir
               for r in replicas)
    assert replicas[0].ipc("sched_in") != replicas[1].ipc("sched_in")
    cmd = router_command(cfg, ["http://127.0.0.1:40001", "http://127.0.0.1:40002"])
    assert cmd[cmd.index("--port") + 1] == "40000" and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"


def test_multi_node_channels_are_tcp_on_node0():
    cfg = ServerConfig(tp=4, nnodes=2, node_rank=1, dist_init_addr="10.0.0.5:29500")
    assert list(cfg.local_ranks) == [2, 3]
    assert cfg.tp_init_method == "tcp://10.0.0.5:29500"
    assert cfg.results_channel == "tcp://10.0.0.5:29501"
    assert [cfg.worker_channel(r) for r in range(4)] == [
        f"tcp://10.0.0.5:{29502 + r}" for r in range(4)]
    one = ServerConfig(tp=2)
    assert list(one.local_ranks) == [0, 1] and one.worker_channel(1).startswith("ipc://")
    assert one.tp_init_method.startswith("file://")


@pytest.mark.parametrize("options, message", [
    (dict(nnodes=2, tp=2), "needs dist_init_addr"),
    (dict(nnodes=2, tp=3, dist_init_addr="h:1234"), r"nnodes \(2\) must divide tp \(3\)"),
    (dict(nnodes=2, tp=2, node_rank=2, dist_init_addr="h:1234"), "node_rank"),
    (dict(dist_init_addr="no-port"), "host:port"),
    (dict(dp=2, nnodes=2, tp=2, dist_init_addr="h:1234"), "not supported"),
    (dict(dp=0), "dp must be >= 1"),
    (dict(dp=2, router_policy="fastest"), "router_policy"),
    (dict(dp=4, port=65530), "needs ports"),
    (dict(dp=2, port=0), "needs a port"),
])
def test_impossible_scale_out_options_fail_clearly(options, message):
    with pytest.raises(ConfigError, match=message):
        ServerConfig(**options)


@pytest.mark.parametrize("options", [dict(dp=2), dict(tp=2, nnodes=2, node_rank=1,
                                                     dist_init_addr="127.0.0.1:29500")])
def test_an_engine_refuses_what_only_sluice_serve_runs(options):
    with pytest.raises(ConfigError, match="options of `sluice serve`"):
        Engine(model="dummy:tiny", **options)
