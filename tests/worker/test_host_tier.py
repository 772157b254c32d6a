"""The host KV tier with the real worker and scheduler in one process: KV written back to the
host pool and loaded into other device slots gives the greedy tokens of KV that never
left the device, and so does a request swapped out and back. Every plan's copies are
also checked byte for byte where they land (`CheckedCopies`).

On the CPU the host pool is a second CPU tensor; on a GPU (marked `gpu`) it is registered
host memory the copy kernel addresses directly, and the copies run on their own stream.
Token equality needs float32 there, with the torch attention (torch leaves TF32 off): in bfloat16 a
random model's greedy tokens depend on the batch mix, and a pool of another size batches
differently. The serving configuration (bfloat16, Triton attention, CUDA graphs) is
checked by the bytes the copies move. The GPU cases are the ones to run under the
memory checker, with a pool small enough that write-backs, loads and slot reuse interleave:

    compute-sanitizer --tool memcheck python -m pytest -q -m gpu tests/worker/test_host_tier.py

The copies' bytes, fp8 pools and their scales included, are checked directly in
tests/worker/test_kv_transfer.py (an fp8 pool's greedy tokens depend on the batch mix,
so a token comparison there would not test the tier).
"""

from __future__ import annotations

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.kv_transfer import KVTransfer
from runtime.worker.worker import Worker
from tests.worker.in_process import run_to_end

HOST_GIB = 0.05


class CheckedCopies:
    """Wraps a worker's `KVTransfer.run`: once a plan's copies are issued (the forwards in
    flight still running), waits for the device and compares bytes. Every loaded device
    slot holds its host slot's bytes, and every host slot written back holds its device
    slot's (unless the same plan loaded that device slot again), and so for the entry ids
    of a model with compressed entries. A copy to the wrong place, or a write-back that
    read a slot before the forward writing it was done, fails."""

    def __init__(self, xfer: KVTransfer) -> None:
        self.xfer, self._run = xfer, xfer.run
        xfer.run = self.run
        self.writeback_slots = self.load_slots = 0  # slot pairs checked
        self.entry_ids = 0  # entry id pairs checked
        self.entry_loads = 0  # entry ids loaded

    def run(self, plan: BatchPlan):
        timing = self._run(plan)
        if self.xfer.cuda:
            torch.cuda.synchronize(self.xfer.device)
        self.writeback_slots += self._both(plan.writeback_dev, plan.writeback_host,
                                           plan.load_dev, plan.load_host, self.xfer.groups,
                                           plan.batch_id)
        self.load_slots += len(plan.load_dev)
        loads = {m: (dev, host) for m, host, dev in plan.entry_load}
        self.entry_loads += sum(len(dev) for dev, _ in loads.values())
        for m, dev, host in plan.entry_writeback:
            self.entry_ids += self._both(dev, host, *loads.pop(m, ([], [])),
                                         self.xfer.entry_groups[m], plan.batch_id)
        for m, (dev, host) in loads.items():
            self.entry_ids += self._both([], [], dev, host, self.xfer.entry_groups[m],
                                         plan.batch_id)
        return timing

    def _both(self, wb_dev: list[int], wb_host: list[int], ld_dev: list[int],
              ld_host: list[int], groups, batch_id: int) -> int:
        """Check a plan's write-backs and loads in `groups`: the pairs checked."""
        loaded = set(ld_dev)
        wb = [(d, h) for d, h in zip(wb_dev, wb_host, strict=True) if d not in loaded]
        self._check(wb, groups, "write-back", batch_id)
        self._check(list(zip(ld_dev, ld_host, strict=True)), groups, "load", batch_id)
        return len(wb) + len(ld_dev)

    def _check(self, pairs: list[tuple[int, int]], groups, what: str, batch_id: int) -> None:
        if not pairs:
            return
        dev = torch.tensor([d for d, _ in pairs], device=self.xfer.device)
        host = torch.tensor([h for _, h in pairs])
        for dev_group, host_group in groups:
            for a, b in zip(dev_group.tensors, host_group.tensors, strict=True):
                # [n, kv_heads(, head_dim)] as bytes
                got, want = a[dev].view(torch.uint8).cpu(), b[host].view(torch.uint8)
                bad = (got != want).flatten(1).any(1).nonzero().flatten().tolist()
                assert not bad, f"{what} of batch {batch_id}: {[pairs[i] for i in bad]} differ"


def serve_turns(cfg: ServerConfig, turns: list[list[list[int]]], max_tokens: int):
    """Run conversations turn by turn in one scheduler and worker: each turn's prompt is the
    conversation so far plus `turns[t][c]`. Returns the outputs, the scheduler and the
    copy checker (None without a host tier)."""
    spec = resolve_model(cfg.model)
    worker = Worker(cfg, spec)
    copies = CheckedCopies(worker.transfer) if worker.transfer is not None else None
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
    return outs_all, sched, copies


def turns_of(n: int, turns: int, seed: int) -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randint(3, 1024, (int(k),), generator=gen).tolist()
             for k in torch.randint(8, 40, (n,), generator=gen)] for _ in range(turns)]


def tier_configs(base: ServerConfig, kv_slots: int) -> dict[str, ServerConfig]:
    """`base` with a host tier under a pool of `kv_slots`, and swapping (token and paged)
    under half of it."""
    tier = base.replace(kv_slots=kv_slots, host_kv_gib=HOST_GIB)
    swap = tier.replace(preempt="swap", schedule_conservativeness=0.0, kv_slots=kv_slots // 2)
    return {"tier": tier, "swap": swap, "paged swap": swap.replace(kv="paged")}


def serve_with_copies(cfg: ServerConfig, turns) -> tuple[list, object, CheckedCopies]:
    """`serve_turns` of `cfg` (with a host tier): outputs, scheduler and copy checker, after
    asserting that KV really went to the host and came back, every copy byte-checked."""
    got, sched, copies = serve_turns(cfg, turns, 6)
    host = sched.kv.stats().host
    assert host.writeback_tokens > 0 and copies.writeback_slots > 0
    if cfg.preempt == "swap":
        assert sched.num_swaps > 0
    if cfg.kv == "token":  # paged: the swapped blocks may still be cached on the device
        # when they are needed again; its loads are covered by tests/scheduler/test_host_tier.py
        assert host.load_tokens > 0 and copies.load_slots > 0
    return got, sched, copies


def check_tier(device: str, kv_slots: int, dtype: str, model: str = "dummy:tiny",
               configs: tuple[str, ...] = ("tier", "swap", "paged swap"),
               **options) -> CheckedCopies:
    """Prefixes from the host, and swaps (`configs` of `tier_configs`), give the tokens of
    a pool large enough to keep everything on the device; the last copy checker."""
    turns = turns_of(8, 3, seed=7)
    base = ServerConfig(model=model, device=device, dtype=dtype, kv_slots=4095,
                        max_running=16, chunk_size=64, torch_threads=1, log_level="warning",
                        **options)
    ref, _, _ = serve_turns(base, turns, 6)
    for name in configs:
        got, sched, copies = serve_with_copies(tier_configs(base, kv_slots)[name], turns)
        assert got == ref, name
        if name == "tier":
            assert sched.kv.stats().host.hit_tokens > 0
            assert sched.load_seconds > 0 and sched.writeback_seconds > 0
    return copies


def test_host_tier_and_swap_keep_greedy_outputs_on_the_cpu():
    check_tier("cpu", 255, "float32")


def test_deepseek_v4_entries_go_to_the_host_and_back_with_their_slots():
    """DeepSeek-V4: its K=V rows and, in the entry pools, its compressed entries and indexer
    keys (by the ids the slots closing their windows hold, or their pages give) are written
    back and loaded into fresh slots and ids, prefixes and swaps in both layouts alike."""
    copies = check_tier("cpu", 255, "float32", model="dummy:deepseek-v4-tiny")
    assert copies.entry_ids > 0


@pytest.mark.gpu
def test_host_tier_and_swap_keep_greedy_outputs_on_the_gpu():
    check_tier("cuda", 255, "float32", attention_backend="torch", cuda_graph=False)


@pytest.mark.gpu
def test_host_tier_copies_in_the_serving_configuration_move_exact_bytes():
    """bfloat16, Triton attention and CUDA graphs, overlapped: every write-back and load
    of a multi-turn run, swaps included, lands byte for byte."""
    base = ServerConfig(model="dummy:tiny", device="cuda", dtype="bfloat16", max_running=16,
                        chunk_size=64, log_level="warning")
    for cfg in tier_configs(base, 255).values():
        serve_with_copies(cfg, turns_of(8, 3, seed=7))


def test_a_host_tier_larger_than_host_memory_is_refused():
    cfg = ServerConfig(model="dummy:tiny", device="cpu", kv_slots=255, host_kv_gib=1 << 20,
                       log_level="warning")
    with pytest.raises(MemoryError, match="host-kv-gib"):
        Worker(cfg, resolve_model(cfg.model))
