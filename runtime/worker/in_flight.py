"""`InFlight`: a launched step whose results reach the host without the main thread
waiting, and the sender thread that waits for them in order and reports them."""

from __future__ import annotations

import queue
from dataclasses import dataclass

import torch

from runtime.wire.ipc import PushQueue
from runtime.wire.worker_channel import GrammarCompiled, StepResult
from runtime.worker.kv_transfer import CopyTiming
from runtime.worker.step_output import StepOutput
from runtime.worker.step_timing import StepTimer, StepTiming


class _HostEvent:
    """Stands in for a CUDA event on the CPU, where work is already complete."""

    def synchronize(self) -> None:
        pass


@dataclass
class InFlight:
    """A launched batch: its results are valid in host memory once `event` completes."""

    batch_id: int
    output: StepOutput  # copied to the host (pinned on CUDA)
    event: object
    timing: StepTiming | None = None  # only under SLUICE_STEP_TIMING
    copies: CopyTiming | None = None  # the plan's host-tier copies, which the step waited for

    @classmethod
    def launch(cls, batch_id: int, output: StepOutput, device: torch.device,
               timing: StepTiming | None, copies: CopyTiming | None) -> InFlight:
        """Start copying the step's `output` to the host (pinned memory on CUDA) and
        record the event that says when it is there; nothing waits."""
        on_cuda = device.type == "cuda"
        output.to_host(pinned=on_cuda)
        if not on_cuda:
            return cls(batch_id, output, _HostEvent(), timing, copies)
        event = torch.cuda.Event()
        event.record()
        return cls(batch_id, output, event, timing, copies)

    def result(self) -> StepResult:
        self.event.synchronize()
        res = self.output.result(self.batch_id)
        if self.copies is not None:
            res.writeback_s, res.load_s = (self.copies.seconds("writeback"),
                                           self.copies.seconds("load"))
        return res


def send_results(out: PushQueue, pending: queue.Queue, timer: StepTimer | None,
                 report_steps: bool) -> None:
    """Sender thread: wait for each launched batch in order and send its result, and
    send each `GrammarCompiled` queued by the compile thread. Only rank 0 reports steps
    (`report_steps`): the other ranks only wait, so their buffers retire in order."""
    while True:
        item = pending.get()
        if item is None:
            return
        if isinstance(item, InFlight):
            result = item.result()
            if item.timing is not None:  # the batch completed: its marks can be read
                timer.log(item.batch_id, item.timing)
            item = result
        if report_steps or isinstance(item, GrammarCompiled):
            out.put(item)
