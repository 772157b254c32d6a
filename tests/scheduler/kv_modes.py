"""Build a Scheduler for any KV mode exactly as the scheduler process does, plus a fake worker."""

from __future__ import annotations

import tempfile

import numpy as np

from runtime.config.server import ServerConfig
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.loop import build_scheduler
from runtime.scheduler.req import Req
from runtime.scheduler.scheduler import Scheduler
from runtime.wire.worker_channel import WorkerReady
from tests.scheduler.fake_worker import FakeWorker


def build_mode(
    kv: str, num_slots: int = 4096, rows: int = 80, max_context: int = 512,
    host_slots: int = 0, prefix_rule: tuple[int, int] = (1, 0),
    entry_ids: dict[int, int] | None = None, **options
) -> tuple[Scheduler, FakeWorker]:
    """`options` are ServerConfig fields (chunk_size, block_size, overlap, reserve, ...);
    `host_slots` sizes the host tier the worker reports (`host_kv_gib` must be set too);
    `prefix_rule` is the model's (prefix_align, prefix_replay) it reports, `entry_ids` the
    compressed-entry ids it asks the scheduler to hand out (and on the host tier, one a
    window of its slots)."""
    cfg = ServerConfig(kv=kv, ipc_dir=tempfile.gettempdir(), **options)
    ready = WorkerReady(
        kv_slots=num_slots,
        max_rows=rows,
        max_context=max_context,
        kv_bytes_per_token=0,
        device="cpu",
        host_kv_slots=host_slots,
        prefix_align=prefix_rule[0],
        prefix_replay=prefix_rule[1],
        entry_ids=entry_ids or {},
        host_entry_ids={m: -(-host_slots // m) for m in entry_ids or {}} if host_slots else {},
    )
    sched = build_scheduler(cfg, ready, max_context)
    return sched, FakeWorker(num_slots, rows, max_context, sched.kv.page_size, host_slots)


def grow(kv: KVManager, req: Req, n: int) -> np.ndarray:
    """Give `req` its next `n` positions as a step does: `try_alloc`, then the `kv_len`
    advance `Batch.to_plan` makes. Returns the new pages."""
    pages = kv.try_alloc(req, n)
    assert pages is not None, f"no room for {n} positions of {req}"
    req.kv_len += n
    return pages


def no_eos(reqs: list, max_tokens: int) -> list:
    """The same prompts, each generating exactly `max_tokens` (no stop ids)."""
    out = []
    for r in reqs:
        r.params.max_tokens, r.params.ignore_eos, r.stop_ids = max_tokens, True, []
        out.append(r)
    return out
