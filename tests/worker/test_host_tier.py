"""The host KV tier with the real worker and scheduler in one process: KV written back to the
host pool and loaded into other device slots gives the greedy tokens of KV that never
left the device, and so does a request swapped out and back.

On the CPU the host pool is a second CPU tensor; on a GPU (marked `gpu`) it is pinned host
memory and the copies run on their own stream. The GPU case is the one to run under the
memory checker, with a pool small enough that write-backs, loads and slot reuse interleave:

    compute-sanitizer --tool memcheck python -m pytest -q -m gpu tests/worker/test_host_tier.py

The copies' bytes, fp8 pools and their scales included, are checked directly in
tests/worker/test_kv_transfer.py (an fp8 pool's greedy tokens depend on the batch mix,
so a token comparison there would not test the tier).
"""

from __future__ import annotations

import pytest
import torch

from runtime.config import ServerConfig
from runtime.messages import GenerateReq, SamplingParams
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.worker.worker import Worker
from tests.worker.in_process import run_to_end

HOST_GIB = 0.05


def serve_turns(cfg: ServerConfig, turns: list[list[list[int]]], max_tokens: int):
    """Run conversations turn by turn in one scheduler and worker: each turn's prompt is the
    conversation so far plus `turns[t][c]`. Returns the outputs and the scheduler."""
    spec = resolve_model(cfg.model)
    worker = Worker(cfg, spec)
    sched = build_scheduler(cfg, worker.ready_message(), spec.max_context)
    history = [[] for _ in turns[0]]
    outs_all = []
    for t, user in enumerate(turns):
        outs: dict[str, list[int]] = {}
        for c, msg in enumerate(user):
            history[c] = history[c] + msg
            sched.add(GenerateReq(f"c{c}t{t}", history[c],
                                  SamplingParams(max_tokens=max_tokens, temperature=0.0)))
            outs[f"c{c}t{t}"] = []
        run_to_end(sched, worker, outs)
        for c in range(len(user)):
            history[c] = history[c] + outs[f"c{c}t{t}"]
        outs_all.append([outs[f"c{c}t{t}"] for c in range(len(user))])
    return outs_all, sched


def turns_of(n: int, turns: int, seed: int) -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randint(3, 1024, (int(k),), generator=gen).tolist()
             for k in torch.randint(8, 40, (n,), generator=gen)] for _ in range(turns)]


def check_tier(device: str, kv_slots: int, dtype: str) -> None:
    """Prefixes from the host, and swaps in both layouts, give the tokens of a pool large
    enough to keep everything on the device."""
    turns = turns_of(8, 3, seed=7)
    base = ServerConfig(model="dummy:tiny", device=device, dtype=dtype, kv_slots=4095,
                        max_running=16, chunk_size=64, log_level="warning")
    ref, _ = serve_turns(base, turns, 6)
    small = base.replace(kv_slots=kv_slots, host_kv_gib=HOST_GIB)
    got, sched = serve_turns(small, turns, 6)
    assert got == ref
    host = sched.kv.stats().host
    assert host.hit_tokens > 0 and host.writeback_tokens > 0
    assert sched.load_seconds > 0 and sched.writeback_seconds > 0
    swap = small.replace(preempt="swap", schedule_conservativeness=0.0, kv_slots=kv_slots // 2)
    swapped, sched = serve_turns(swap, turns, 6)
    assert swapped == ref
    assert sched.num_swaps > 0 and sched.kv.stats().host.load_tokens > 0
    # paged: the swapped blocks may still be cached on the device when they are needed
    # again; the loads themselves are covered by tests/scheduler/test_host_tier.py
    swapped, sched = serve_turns(swap.replace(kv="paged"), turns, 6)
    assert swapped == ref
    assert sched.num_swaps > 0 and sched.kv.stats().host.writeback_tokens > 0


def test_host_tier_and_swap_keep_greedy_outputs_on_the_cpu():
    check_tier("cpu", 255, "float32")


@pytest.mark.gpu
def test_host_tier_and_swap_keep_greedy_outputs_on_the_gpu():
    check_tier("cuda", 255, "bfloat16")


def test_a_host_tier_larger_than_host_memory_is_refused():
    cfg = ServerConfig(model="dummy:tiny", device="cpu", kv_slots=255, host_kv_gib=1 << 20,
                       log_level="warning")
    with pytest.raises(MemoryError, match="host-kv-gib"):
        Worker(cfg, resolve_model(cfg.model))
