"""Peak host memory of this process and the processes it starts, sampled from /proc.

`RssAnon` is the anonymous memory a process holds (heap, tensors in host memory, pinned
buffers): pages of mapped files (`RssFile`), such as a memory-mapped checkpoint, do not
count, since the kernel can drop them. `VmRSS` counts both. A thread reads
`/proc/<pid>/status` every `period_s` for this process and, with `children=True`, every
descendant (looked up again every `scan_every` samples), and keeps each one's peaks.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
import threading
from dataclasses import dataclass

MIB = 2**20
_FIELDS = ("RssAnon", "VmRSS", "VmHWM")


def status_bytes(pid: int | str = "self") -> dict[str, int]:
    """RssAnon, VmRSS and VmHWM of process `pid` in bytes ({} once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    found = {k: re.search(rf"^{k}:\s+(\d+) kB", text, re.M) for k in _FIELDS}
    return {k: int(m.group(1)) * 1024 for k, m in found.items() if m}


def release_free_memory() -> None:
    """Collect garbage and hand the allocator's free pages back to the kernel (glibc's
    `malloc_trim`), so RssAnon counts live memory only: a baseline taken after a large
    tensor was freed would otherwise still include it."""
    gc.collect()
    with contextlib.suppress(AttributeError, OSError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def descendants(root: int) -> list[int]:
    """Every live process below `root`, from the parent ids in /proc/<pid>/stat."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found


@dataclass
class Peak:
    """The largest values seen for one process, in bytes."""

    rss_anon: int = 0
    rss: int = 0
    hwm: int = 0


class MemorySampler:
    """`with MemorySampler() as m: ...`, then `m.peaks[pid]` (this process: `os.getpid()`)."""

    def __init__(self, period_s: float = 0.005, children: bool = False,
                 scan_every: int = 20) -> None:
        self.period_s, self.children, self.scan_every = period_s, children, scan_every
        self.peaks: dict[int, Peak] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._sample([os.getpid()])
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def own(self) -> Peak:
        return self.peaks[os.getpid()]

    def _run(self) -> None:
        pids, n = [os.getpid()], 0
        while not self._stop.wait(self.period_s):
            if self.children and n % self.scan_every == 0:
                pids = [os.getpid(), *descendants(os.getpid())]
            self._sample(pids)
            n += 1
        self._sample(pids)

    def _sample(self, pids: list[int]) -> None:
        for pid in pids:
            s = status_bytes(pid)
            if not s:
                continue
            p = self.peaks.setdefault(pid, Peak())
            p.rss_anon = max(p.rss_anon, s.get("RssAnon", 0))
            p.rss = max(p.rss, s.get("VmRSS", 0))
            p.hwm = max(p.hwm, s.get("VmHWM", 0))
