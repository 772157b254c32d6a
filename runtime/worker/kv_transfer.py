"""`KVTransfer`: the host KV pool (`--host-kv-gib`) and the copies a plan orders between it
and the device pool.

The host pool mirrors the device pool's tensors: those of `KVPool.layer_tensors()`
(every layer's K, then every layer's V, then a quantized pool's scales), and any other
tensors indexed by the same slots (a drafter's pools and feature rows), are grouped by
shape and dtype, and each group has one host tensor `[host_slots + 1, members, ...]`,
slot-major, so that a slot's rows of every member are one contiguous run of whole lines
(the kernel writes short rows, the scales, as such runs: see `kernels.kv.copy_slots`).
All of them live in one page-aligned anonymous mapping, registered with the device once
(pinned in place, mapped for the kernel) and unregistered before it can be unmapped:
memory freed while registered, or two registrations sharing a page, make the next
registration of those pages fail. Its slots are the scheduler's host slot ids. A model
with compressed entries in entry pools beside the rows (DeepSeek-V4) has host entry pools
of their own ids likewise, copied with the slots that hold those ids.

A plan's copies run before its forward, write-backs first, on a copy stream of their own.
Each is one `kernels.kv.copy_slots` launch per group (all layers, K and V): the kernel reads the
scattered device slots and writes the scattered host slots directly over the bus, or the
reverse for a load, so nothing is staged and the CPU touches no KV. The slot lists go up
as one index tensor, copied from pinned memory without blocking, on the same stream.

Ordering (one rule, the overlap's delayed release): a copy never waits for the device,
and needs no event of its own, because of what the scheduler orders and when.
- Against the compute stream, before: the copy stream does not wait for the batches in
  flight. It need not: the scheduler orders a copy only of device slots that no batch in
  flight reads or writes. A write-back reads a radix-tree node that no running request
  locks, or the blocks of a request swapped out while nothing is in flight; a finished
  request's KV reaches the tree only once every batch holding it completed (the CUDA
  event the sender thread waits on). A load writes slots just taken from the free list,
  which holds no slot of a batch in flight for the same reason. Waiting for the compute
  stream instead would put each plan's copies behind the forward before it, on the
  critical path, for nothing.
- Against the compute stream, after: the compute stream waits for the copy stream before
  the step's forward, so it never reads a slot still loading nor writes one still being
  written back: a device slot the scheduler frees in the plan that orders its write-back
  can be reused by that step.
- Among copies: stream order keeps a host slot's write-back before a later load or reuse
  of it; within one launch the scheduler never orders two copies into one slot.
On the CPU the same copies run synchronously through the torch reference.
"""

from __future__ import annotations

import contextlib
import mmap
import time
import weakref
from collections.abc import Sequence

import torch

from kernels.kv.copy_slots import SlotTensors, copy_slots, copy_slots_ref
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.kv_pool import GiB, KVPool

_HOST_REGISTER_MAPPED = 2  # cudaHostRegisterMapped
_HOST_ALIGN = 4096  # each host tensor starts on a page of its own


def host_memory_available() -> int:
    """Bytes of host memory available to new allocations (MemAvailable)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def host_slots_for(gib: float, bytes_per_token: int, workers: int = 1) -> int:
    """Host slots of `gib` GiB per worker; refuses a size the host cannot hold."""
    want = int(gib * GiB)
    available = host_memory_available()
    if want * workers > available:
        raise MemoryError(
            f"--host-kv-gib {gib} x {workers} worker(s) needs {want * workers / GiB:.1f} GiB "
            f"of host memory, but only {available / GiB:.1f} GiB is available")
    if want < bytes_per_token:
        raise ValueError(f"--host-kv-gib {gib} holds no token ({bytes_per_token} bytes each)")
    return want // bytes_per_token


class CopyTiming:
    """Device time of one plan's write-backs and loads, readable once the step is done."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: dict[str, list] = {}

    def start(self, name: str, stream: torch.cuda.Stream | None) -> None:
        self.marks[name] = [self._mark(stream)]

    def stop(self, name: str, stream: torch.cuda.Stream | None) -> None:
        self.marks[name].append(self._mark(stream))

    def _mark(self, stream):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def seconds(self, name: str) -> float:
        if name not in self.marks:
            return 0.0
        begin, end = self.marks[name]
        return begin.elapsed_time(end) / 1e3 if self.cuda else end - begin


def _by_shape(tensors: Sequence[torch.Tensor]) -> dict[tuple, list[torch.Tensor]]:
    """`tensors` grouped by (row shape, dtype)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((tuple(t.shape[1:]), t.dtype), []).append(t)
    return groups


class KVTransfer:
    """A host pool of `num_slots` slots (plus the padding slot 0) mirroring `pool` and
    the tensors `extra` indexed by its slots (`[pool slots, ...]` each); and, for a model
    with compressed entries, host entry pools of their own ids: `entries[rate]` is (the
    device entry pools of that rate, `[ids, ...]` each; the host ids, the sink included)."""

    def __init__(self, pool: KVPool, num_slots: int, extra: Sequence[torch.Tensor] = (),
                 entries: dict[int, tuple[list[torch.Tensor], int]] | None = None) -> None:
        if num_slots < 1:
            raise ValueError(f"the host tier needs at least 1 slot, got {num_slots}")
        self.num_slots = num_slots
        self.device = pool.k[0].device
        self.cuda = self.device.type == "cuda"
        entries = entries or {}
        # (host rows, shape/dtype groups) of the slots, then of each rate's entry ids
        spaces = [(num_slots + 1, _by_shape([*pool.layer_tensors(), *extra]))]
        spaces += [(ids, _by_shape(tensors)) for tensors, ids in entries.values()]
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        # per shape/dtype group: the device tensors and one slot-major host tensor
        # [host rows, n, ...] (a slot's or id's rows of the group side by side)
        self.hosts = self._host_tensors([((rows, len(ts), *shape), dtype)
                                         for rows, groups in spaces
                                         for (shape, dtype), ts in groups.items()])
        hosts = iter(self.hosts)
        pairs = [[(SlotTensors.of(ts, self.device),
                   SlotTensors.slot_major(next(hosts), self.device)) for ts in groups.values()]
                 for _, groups in spaces]
        self.groups, self.entry_groups = pairs[0], dict(zip(entries, pairs[1:], strict=True))
        self.copy = copy_slots if self.cuda else copy_slots_ref

    def _host_tensors(self, specs: list[tuple[tuple, torch.dtype]]) -> list[torch.Tensor]:
        """Zeroed host tensors of `specs` (shape, dtype), each page-aligned in one anonymous
        mapping; on a GPU registered with it, mapped, so the copy kernel addresses them."""
        nbytes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs]
        starts = [0]
        for n in nbytes:  # each tensor rounded up to whole pages
            starts.append(starts[-1] + -(-n // _HOST_ALIGN) * _HOST_ALIGN)
        buf = mmap.mmap(-1, starts[-1], flags=mmap.MAP_PRIVATE)
        raw = torch.frombuffer(buf, dtype=torch.uint8)  # [total bytes], zero pages
        tensors = [raw[start:start + n].view(dtype).view(shape)
                   for (shape, dtype), start, n in zip(specs, starts, nbytes)]
        if self.cuda:
            err = torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), len(buf),
                                                       _HOST_REGISTER_MAPPED)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of the host KV pool failed ({err})")
            # unregistered (after the copies in flight) before the mapping can go away
            weakref.finalize(self, _unregister, self.stream, raw.data_ptr(), buf).atexit = False
        return tensors

    def run(self, plan: BatchPlan) -> CopyTiming | None:
        """Issue `plan`'s copies; the compute stream waits for them. None: no copies."""
        if not plan.writeback_dev and not plan.load_dev:
            return None
        timing = CopyTiming(self.cuda)
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
            if plan.writeback_dev:
                self._copy("writeback", timing, plan.writeback_dev, plan.writeback_host,
                           plan.entry_writeback, to_host=True)
            if plan.load_dev:
                self._copy("load", timing, plan.load_host, plan.load_dev, plan.entry_load,
                           to_host=False)
        if self.cuda:
            compute.wait_stream(self.stream)
        return timing

    def _copy(self, name: str, timing: CopyTiming, src: list[int], dst: list[int],
              entries: list[tuple[int, list[int], list[int]]], *, to_host: bool) -> None:
        """Copy slots `src` to slots `dst` in every tensor group, and each (rate, source
        ids, destination ids) of `entries` in that rate's entry groups, device to host
        (`to_host`) or back, timed as `name`."""
        timing.start(name, self.stream)
        for groups, ids in [(self.groups, (src, dst))] + [
                (self.entry_groups[m], (s, d)) for m, s, d in entries]:
            src_rows, dst_rows = self._slots(*ids)
            for dev_tensors, host_tensors in groups:
                pair = (dev_tensors, host_tensors) if to_host else (host_tensors, dev_tensors)
                self.copy(*pair, src_rows, dst_rows)
        timing.stop(name, self.stream)

    def _slots(self, src: list[int], dst: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`src`, `dst` as index tensors where the copy runs: on a GPU, uploaded from pinned
        memory without blocking, on the copy stream (the caching host allocator keeps the
        pinned block until that upload is done)."""
        both = torch.tensor([src, dst], dtype=torch.int64)  # [2, n]
        if self.cuda:
            both = both.pin_memory().to(self.device, non_blocking=True)
        return both[0], both[1]


def _unregister(stream: torch.cuda.Stream, ptr: int, buf: mmap.mmap) -> None:
    """Unpin the host pool at `ptr` once `stream`'s copies are done; `buf`, its mapping,
    is held until then."""
    stream.synchronize()
    torch.cuda.cudart().cudaHostUnregister(ptr)
