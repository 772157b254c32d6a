"""The `Limits` record the scheduler sends the api: every cap applied once, in one place."""

from __future__ import annotations

import pytest

from runtime.config.server import ServerConfig
from runtime.scheduler.loop import build_scheduler, limits
from runtime.wire.worker_channel import WorkerReady


def ready(kv_slots: int = 4096, max_context: int = 8192) -> WorkerReady:
    return WorkerReady(kv_slots=kv_slots, max_rows=8, max_context=max_context,
                       kv_bytes_per_token=1024, device="cpu")


@pytest.mark.parametrize("kv", ["token", "paged", "contiguous"])
@pytest.mark.parametrize("model, worker, pool, expected", [
    (8192, 256, 4096, 256),  # the worker's cap (a 256-token sliding window)
    (512, 8192, 4096, 512),  # the model's own context
    (8192, 8192, 300, 300),  # the KV pool
])
def test_limits_take_every_cap(kv, model, worker, pool, expected):
    cfg = ServerConfig(ipc_dir="/tmp", kv=kv, max_running=4)
    worker_ready = ready(pool, worker)
    sched = build_scheduler(cfg, worker_ready, model)
    got = limits(sched, model, worker_ready)
    # paged: the pool rounds down to whole blocks (and keeps one back)
    assert got.max_context == sched.max_context == min(expected, sched.kv.total)
    assert got.max_req_input_len == got.max_context - 1
    assert got.max_running == 4 and got.kv_slots == sched.kv.total
    assert got.model_max_context == model


def test_limits_carry_the_workers_weight_and_kv_formats():
    cfg = ServerConfig(ipc_dir="/tmp", max_running=4)
    worker_ready = WorkerReady(kv_slots=4096, max_rows=8, max_context=8192,
                               kv_bytes_per_token=1024, device="cpu", kv_dtype="fp8",
                               quantization="fp8")
    got = limits(build_scheduler(cfg, worker_ready, 8192), 8192, worker_ready)
    assert (got.quantization, got.kv_dtype) == ("fp8", "fp8")
