"""`ThreadTuner`: how many torch threads a CPU worker runs with, chosen by measuring.

On a quiet machine a CPU step is fastest with one intra-op thread per CPU. On a busy one
(other processes running, including the server's own api and scheduler) the same threads
stall each other: torch's parallel regions end at a barrier, and a thread the OS has
descheduled holds every other one up, so the step can run several times slower than on a
single thread. No fixed count is right for both, and the load changes while a server
runs, so with `--torch-threads 0` a CPU worker tries its candidate counts now and then on
consecutive steps of the same shape and keeps the fastest.

The candidates come from the CPUs this process may run on (`os.sched_getaffinity`, which
follows `taskset` and container CPU sets), not from the host's core count.
"""

from __future__ import annotations

import logging
import os
import statistics

import torch

from runtime.wire.worker_channel import BatchPlan

log = logging.getLogger(__name__)

HOLD_STEPS = 96  # steps between two probes
SKIP_STEPS = 1  # steps after a switch that are not timed (the thread pool warms up)
TIMED_STEPS = 5  # timed steps per candidate in a probe (their median counts)
UP_MARGIN = 0.05  # more threads must be this much faster to replace the current count
DOWN_MARGIN = 0.2  # fewer threads must be this much faster: a quiet machine's step times
# vary by ~10% between runs, and a wrong move down costs more than a missed one


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def candidates(cpus: int) -> list[int]:
    """Thread counts worth trying on `cpus` CPUs: one, half of them, all of them."""
    return sorted({1, max(1, cpus // 2), cpus})


class ThreadTuner:
    """Keeps torch's intra-op thread count at the fastest of `counts`, by timing steps.

    Call `observe(plan, seconds)` after each synchronous CPU step. From the first step,
    and then every `HOLD_STEPS` steps, a probe runs each count on `SKIP_STEPS +
    TIMED_STEPS` consecutive steps; a probe whose steps change shape (batch size or token
    count) starts over, on the current count. The fastest count (median step time) wins
    when it beats the current one by `UP_MARGIN` (more threads) or `DOWN_MARGIN` (fewer):
    contention makes extra threads several times slower, which clears either margin,
    while noise on a quiet machine does not clear the second.
    """

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.current = counts[-1]
        self._since_probe = 0
        self._probe: list[int] | None = None  # counts still to time in this probe
        self._times: dict[int, list[float]] = {}
        self._shape: tuple[int, int] | None = None
        self._skip = 0
        self._start_probe()  # the first steps already choose

    @classmethod
    def for_worker(cls, torch_threads: int, device: torch.device,
                   tp: int = 1) -> ThreadTuner | None:
        """A tuner for a CPU worker left to choose (`--torch-threads 0`), else None after
        applying the fixed count. TP ranks, which wait for each other every layer, share
        the usable CPUs evenly instead of tuning apart."""
        if torch_threads:
            torch.set_num_threads(torch_threads)
            return None
        if device.type != "cpu":
            return None
        cpus = usable_cpus()
        if tp > 1 or cpus == 1:
            torch.set_num_threads(max(1, cpus // tp))
            return None
        return cls(candidates(cpus))

    def observe(self, plan: BatchPlan, seconds: float) -> None:
        """Account one step of `plan` that took `seconds` of wall time."""
        if self._probe is None:
            self._since_probe += 1
            if self._since_probe >= HOLD_STEPS:
                self._start_probe()
            return
        shape = (len(plan.rows), len(plan.input_ids))
        if self._shape is None:
            self._shape = shape
        elif shape != self._shape:  # not comparable: time every count again on this shape
            self._start_probe()
            self._shape = shape
            return
        if self._skip:
            self._skip -= 1
            return
        count = self._probe[0]
        self._times.setdefault(count, []).append(seconds)
        if len(self._times[count]) < TIMED_STEPS:
            return
        self._probe.pop(0)
        if self._probe:
            self._switch(self._probe[0])
        else:
            self._decide()

    def _start_probe(self) -> None:
        self._probe = [self.current] + [c for c in self.counts if c != self.current]
        self._times = {}
        self._shape = None
        self._switch(self.current)

    def _decide(self) -> None:
        means = {c: statistics.median(t) for c, t in self._times.items()}
        best = min(means, key=lambda c: (means[c], c))
        margin = UP_MARGIN if best > self.current else DOWN_MARGIN
        if means[best] > means[self.current] * (1 - margin):
            best = self.current
        if best != self.current:
            log.debug("torch threads %d -> %d (%s)", self.current, best,
                      ", ".join(f"{c}: {m * 1e3:.1f} ms" for c, m in sorted(means.items())))
        self.current = best
        self._switch(best)
        self._probe = None
        self._since_probe = 0

    def _switch(self, count: int) -> None:
        self._skip = SKIP_STEPS
        self._set(count)

    @staticmethod
    def _set(count: int) -> None:
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
