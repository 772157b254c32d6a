"""`KVTransfer`: the host KV pool (`--host-kv-gib`) and the copies a plan orders between it
and the device pool.

The host pool follows the device pool's layout, layer by layer: `kv[i]` is a host copy of
the i-th of `KVPool.layer_tensors()` (every layer's K, then every layer's V), `scales[i]`
of the quantized pool's scale tensors. Its slots are the scheduler's host slot ids.

A plan's copies run before its forward, write-backs first, on a copy stream of their own:
- write-back: gather the device slots (copy stream), one device-to-host transfer into a
  pinned staging buffer, and, once that transfer's event completed, a scatter into the
  host slots (`_settle`, before any later load and whenever the next step finds it done);
- load: a gather of the host slots into pinned staging, one host-to-device transfer, a
  scatter into the device slots (copy stream).
The compute stream waits for the copy stream before the step's forward, so the forward
never reads a slot still loading nor writes one still being written back: a device slot
the scheduler frees in the plan that orders its write-back can be reused by that step.
On the CPU the same steps run synchronously on plain tensors.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque

import torch

from runtime.messages import BatchPlan
from runtime.worker.kv_pool import GiB, KVPool


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


class KVTransfer:
    """A host pool of `num_slots` slots (plus the padding slot 0) mirroring `pool`."""

    def __init__(self, pool: KVPool, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the host tier needs at least 1 slot, got {num_slots}")
        self.num_slots = num_slots
        self.device = pool.k[0].device
        self.cuda = self.device.type == "cuda"
        self.dev = pool.layer_tensors()  # [T] of [num_slots, kv_heads(, head_dim)]
        groups: dict[tuple, list[int]] = {}
        for i, t in enumerate(self.dev):
            groups.setdefault((tuple(t.shape[1:]), t.dtype), []).append(i)
        # one host tensor per shape/dtype group: [n, host_slots + 1, ...]
        self.groups = [(idx, self._host_tensor((len(idx), num_slots + 1, *shape), dtype))
                       for (shape, dtype), idx in groups.items()]
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._pending: deque = deque()  # write-backs in flight: (event, staged, host idx)
        self._loads: deque = deque()  # loads in flight: (event, staged buffers kept alive)

    def _host_tensor(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        host = torch.zeros(shape, dtype=dtype)
        if self.cuda:  # registered in place: pinned without rounding the size up
            err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(),
                                                       host.numel() * host.element_size(), 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of the host KV pool failed ({err})")
        return host

    @property
    def num_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for _, h in self.groups)

    def run(self, plan: BatchPlan) -> CopyTiming | None:
        """Issue `plan`'s copies; the compute stream waits for them. None: no copies."""
        self._settle(block=False)
        if not plan.writeback_dev and not plan.load_dev:
            return None
        timing = CopyTiming(self.cuda)
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
            if plan.writeback_dev:
                timing.start("writeback", self.stream)
                self._write_back(plan.writeback_dev, plan.writeback_host)
                timing.stop("writeback", self.stream)
            if plan.load_dev:
                self._settle(block=True)  # the host slots hold every earlier write-back
                timing.start("load", self.stream)
                self._load(plan.load_host, plan.load_dev)
                timing.stop("load", self.stream)
        if self.cuda:
            compute.wait_stream(self.stream)
        return timing

    def _write_back(self, dev_slots: list[int], host_slots: list[int]) -> None:
        idx = torch.tensor(dev_slots, dtype=torch.int64, device=self.device)  # [n]
        host_idx = torch.tensor(host_slots, dtype=torch.int64)  # [n]
        for members, host in self.groups:
            gathered = torch.stack([self.dev[i][idx] for i in members])  # [g, n, ...]
            if not self.cuda:
                host[:, host_idx] = gathered
                continue
            staged = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
            staged.copy_(gathered, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            self._pending.append((event, staged, host, host_idx))

    def _load(self, host_slots: list[int], dev_slots: list[int]) -> None:
        idx = torch.tensor(dev_slots, dtype=torch.int64, device=self.device)  # [n]
        host_idx = torch.tensor(host_slots, dtype=torch.int64)  # [n]
        kept = []
        for members, host in self.groups:
            staged = torch.empty((len(members), len(host_slots), *host.shape[2:]),
                                 dtype=host.dtype, pin_memory=self.cuda)  # [g, n, ...]
            torch.index_select(host, 1, host_idx, out=staged)
            values = staged.to(self.device, non_blocking=True)
            for j, i in enumerate(members):
                self.dev[i].index_copy_(0, idx, values[j])
            kept.append(staged)
        if self.cuda:
            event = torch.cuda.Event()
            event.record(self.stream)
            self._loads.append((event, kept))

    def _settle(self, block: bool) -> None:
        """Scatter finished write-backs into the host pool, in order (all of them when
        `block`), and drop the staging of finished loads."""
        while self._pending and (block or self._pending[0][0].query()):
            event, staged, host, host_idx = self._pending.popleft()
            event.synchronize()
            host[:, host_idx] = staged
        while self._loads and self._loads[0][0].query():
            self._loads.popleft()

