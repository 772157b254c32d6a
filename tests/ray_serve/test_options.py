"""`python -m runtime.ray_serve`'s command line: the policy's knobs validated, every
`sluice serve` flag accepted and handed to the replicas' servers unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.cli import build_parser, config_from_args
from runtime.ray_serve.cli import PROG, parse
from runtime.ray_serve.options import RayServeOptions
from runtime.ray_serve.server_args import server_argv


def test_defaults_are_the_stated_policy():
    cfg, opts = parse([])
    assert (opts.min_replicas, opts.upscale_delay_s, opts.downscale_delay_s) == (2, 180.0, 900.0)
    assert (opts.queue_threshold, opts.upscale_utilization, opts.downscale_utilization) == (
        50.0, 0.8, 0.4)
    assert cfg == ServerConfig(run_id=cfg.run_id, ipc_dir=cfg.ipc_dir)


def test_policy_and_server_flags_mix():
    cfg, opts = parse(["--model", "dummy:tiny", "--min-replicas", "3", "--max-replicas", "5",
                       "--tp", "2", "--no-prefix-routing", "--downscale-delay-s", "60",
                       "--port", "8080"])
    assert (cfg.model, cfg.tp, cfg.port) == ("dummy:tiny", 2, 8080)
    assert (opts.min_replicas, opts.max_replicas, opts.prefix_routing,
            opts.downscale_delay_s) == (3, 5, False, 60.0)


@pytest.mark.parametrize("changes, field", [
    ({"min_replicas": 0}, "min_replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
    ({"initial_replicas": 1}, "initial_replicas"),
    ({"initial_replicas": 5}, "initial_replicas"),
    ({"target_ongoing_requests": 0}, "target_ongoing_requests"),
    ({"upscale_delay_s": -1}, "upscale_delay_s"),
    ({"downscale_utilization": 0.9, "upscale_utilization": 0.8}, "downscale_utilization"),
    ({"upscale_utilization": 1.5}, "upscale_utilization"),
    ({"look_back_s": 0}, "look_back_s"),
    ({"queue_threshold": float("nan")}, "queue_threshold"),
])
def test_bad_knobs_are_refused_naming_the_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        RayServeOptions(**changes)


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RayServeOptions().min_replicas = 5


@pytest.mark.parametrize("flags, field", [(["--dp", "2"], "dp"),
                                          (["--nnodes", "2", "--tp", "2",
                                            "--dist-init-addr", "h:1"], "nnodes")])
def test_server_options_a_replica_cannot_run_are_refused(flags, field):
    with pytest.raises(ConfigError, match=field):
        parse(flags)


def test_a_bad_server_flag_is_the_server_configs_error():
    with pytest.raises(ConfigError, match="kv must be one of"):
        parse(["--kv", "nope"])


def test_the_replicas_server_gets_the_same_config():
    flags = ["--model", "dummy:tiny", "--kv", "paged", "--block-size", "32", "--no-overlap",
             "--max-running", "7", "--mem-fraction", "0.5", "--lora-paths", "a=/x", "b=/y",
             "--no-cuda-graph", "--shutdown-grace", "12.5", "--port", "9000",
             "--host", "0.0.0.0"]
    cfg, _ = parse(flags)
    again = config_from_args(build_parser().parse_args(["serve", *server_argv(cfg)]),
                             ipc_dir=cfg.ipc_dir, run_id=cfg.run_id)
    # the replica chooses its own address and ports
    mine = {"host", "port", "rpc_host", "rpc_port"}
    assert cfg.replace(**{k: getattr(again, k) for k in mine}) == again
    assert "--port" not in server_argv(cfg) and "--host" not in server_argv(cfg)


def test_the_command_refuses_bad_flags_in_one_line(capsys):
    pytest.importorskip("ray", reason="the command needs Ray Serve")
    from runtime.ray_serve.__main__ import main

    assert main(["--min-replicas", "0"]) == 2
    assert main(["--dp", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0] == f"{PROG}: min_replicas must be >= 1, got 0"
    assert err[1].startswith(f"{PROG}: dp: Ray Serve runs the replicas")
