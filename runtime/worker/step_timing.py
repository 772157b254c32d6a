"""Opt-in device timing of every worker step, for measuring GPU idle time between steps.

Set `SLUICE_STEP_TIMING=/path/steps.jsonl` in the environment of the worker process (the
`Engine` passes its environment on). The worker then marks the device stream when it starts
enqueueing a batch and once the batch's last op (the copy of sampled ids to the host) is
queued; the sender thread, after the batch completed, appends one JSON line per step:

    {"batch_id": 7, "gap_ms": 0.012, "step_ms": 9.31, "batch_size": 64, "tokens": 64,
     "decode": true, "host_ms": 0.41}

`step_ms` is end - start of this batch on the device; `gap_ms` is this batch's start minus
the previous batch's end: the time the device sat idle in between (0 when the batch was
queued before the previous one finished, as the overlap loop intends; null on the first).
`host_ms` is the worker's host time to enqueue the batch (build inputs, launch, sample,
hand the result to the sender): the host clock from the start mark to the end mark.
On CUDA the marks are timing events on the compute stream; on the CPU, where every op runs
synchronously, they are host clock readings. Unset (the default), nothing is recorded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

ENV = "SLUICE_STEP_TIMING"


class _HostMark:
    """A CPU stand-in for a timing event: the host clock when `record` ran."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: _HostMark) -> float:
        return (end.t - self.t) * 1e3


@dataclass
class StepTiming:
    """The two marks of one launched batch and what it held."""

    start: object
    end: object
    batch_size: int
    tokens: int
    decode: bool
    host_ms: float = 0.0


class StepTimer:
    """Makes the marks (main thread) and writes one line per completed step (sender thread)."""

    def __init__(self, path: str, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        # open for the worker's lifetime; line-buffered, so readers see whole lines at once
        self.file = open(path, "a", buffering=1)  # noqa: SIM115
        self.prev_end = None

    @classmethod
    def from_env(cls, device: torch.device) -> StepTimer | None:
        path = os.environ.get(ENV)
        return cls(path, device) if path else None

    def mark(self):
        """A point in the device stream (now, on the CPU)."""
        if not self.cuda:
            return _HostMark()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def log(self, batch_id: int, t: StepTiming) -> None:
        """Write the step's line; call only after the batch completed (its marks did)."""
        gap = None if self.prev_end is None else self.prev_end.elapsed_time(t.start)
        self.prev_end = t.end
        self.file.write(json.dumps({
            "batch_id": batch_id, "gap_ms": gap, "step_ms": t.start.elapsed_time(t.end),
            "batch_size": t.batch_size, "tokens": t.tokens, "decode": t.decode,
            "host_ms": round(t.host_ms, 4)}) + "\n")
