"""The api process entry (`run_api`) in a real subprocess: Ready, serving, shutdown."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os

import msgspec
import zmq

from runtime.api.process import run_api
from runtime.client import Client
from runtime.procutil import STOP_SIGNAL
from runtime.wire.lifecycle import ProcessDied, Ready
from tests.api.fake_scheduler import FakeScheduler


@contextlib.contextmanager
def api_process(cfg):
    """Spawn the api process; yield (process, its Ready message)."""
    ctx = zmq.Context()
    ready = ctx.socket(zmq.PULL)
    ready.bind(cfg.ipc("ready"))
    proc = mp.get_context("spawn").Process(target=run_api, args=(cfg,), daemon=True)
    proc.start()
    try:
        assert ready.poll(60_000), "the api process never reported"
        yield proc, msgspec.msgpack.decode(ready.recv(), type=Ready)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        ready.close(linger=0)
        ctx.term()


def test_serves_until_its_supervisor_stops_it(cfg, script_ids):
    with FakeScheduler(cfg, lambda r: script_ids), api_process(cfg) as (proc, ready):
        assert ready.name == "api" and ready.error is None
        # it bound free ports (`cfg` has port 0) and reports them
        rpc_port = int(ready.info["rpc"].rsplit(":", 1)[1])
        assert ready.info["rpc"] == f"tcp://{cfg.rpc_host}:{rpc_port}" and rpc_port > 0
        assert int(ready.info["http"].rsplit(":", 1)[1]) > 0
        with Client(ready.info["rpc"], timeout=10) as client:
            out = client.generate("Hello", max_tokens=5)
            assert out.finish_reason == "length" and len(out.token_ids) == 5
        os.kill(proc.pid, STOP_SIGNAL)
        proc.join(10)
        assert proc.exitcode == 0


def test_exits_when_a_process_dies(cfg, script_ids):
    with FakeScheduler(cfg, lambda r: script_ids), api_process(cfg) as (proc, ready):
        assert ready.error is None
        zctx = zmq.Context()
        sup = zctx.socket(zmq.PUSH)
        sup.connect(cfg.ipc("api_in"))
        sup.send(msgspec.msgpack.encode(ProcessDied("worker", 1)))
        proc.join(10)
        sup.close(linger=0)
        zctx.term()
        assert proc.exitcode == 0


def test_startup_failure_reports_error_and_exits_nonzero(cfg):
    bad = cfg.replace(model="/nonexistent/model")
    with api_process(bad) as (proc, ready):
        assert ready.name == "api" and "nonexistent" in ready.error
        proc.join(10)
        assert proc.exitcode == 1
