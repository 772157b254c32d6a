"""`DeviceOracle`: the oracle drafter on the device (benchmarks only).

Like `OracleDrafter` it drafts each request's known continuation (an earlier greedy run's
output), so every draft is accepted and proposing costs nothing; but it drafts in the
worker, as a draft model or an EAGLE head does (`Drafter`), from a table of every row's
whole sequence and the positions of the step on the device. So its verify steps chain
behind the step in flight (`Speculation.chains`): the ceiling of a drafter on the device
with overlap, where `OracleDrafter`'s steps each wait for the previous result.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.scheduler.req import Req
from runtime.scheduler.speculative.speculation import ModelDrafts, Speculation
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder, exclusive_cumsum
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.model_runner import ModelRunner
from runtime.worker.staging import Staging


class DeviceOracle:
    """A `Drafter` replaying `bind`'s sequences: a row's drafts are its sequence's tokens
    after the position of the step's last token."""

    capture = None
    kv_bytes_per_token = 0

    def __init__(self, max_rows: int, max_context: int, device: torch.device) -> None:
        self.table = torch.zeros(max_rows, max_context + 1, dtype=torch.int64,
                                 device=device)  # [rows, positions]
        self.staging = Staging(device)  # copies that wait for nothing on the device

    def allocate(self, runner: ModelRunner, attention_backend: str) -> None:
        pass

    def slot_tensors(self) -> list[torch.Tensor]:
        return []

    def bind(self, row: int, tokens: list[int]) -> None:
        """Row `row` now serves the request whose whole sequence is `tokens`."""
        self.table[row].zero_()
        self.table[row, :len(tokens)] = self.staging.upload(
            {"tokens": np.array(tokens, dtype=np.int64)}, {})["tokens"]

    def step(self, plan: BatchPlan, fb: ForwardBatch, builder: BatchBuilder,
             runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafts of the plan's verify requests into `fb.input_ids`, then the target's
        forward: (its logits, the drafts [D] or None)."""
        if not plan.draft_lens:
            return runner.forward(fb), None
        lens = np.array(plan.draft_lens, dtype=np.int64)  # [B]
        verify = np.flatnonzero(lens)  # [R]
        d = lens[verify]  # [R]
        first = exclusive_cumsum(np.array(plan.extend_lens, dtype=np.int64))[verify]  # [R]
        req = np.repeat(np.arange(len(d)), d)  # [D] each draft's request
        col = np.arange(int(d.sum())) - exclusive_cumsum(d)[req]  # [D] draft j of its request
        idx = {"first": first[req], "row": np.array(plan.rows, dtype=np.int64)[verify][req],
               "col": col}
        dev = self.staging.upload(idx, {})
        last_pos = fb.positions[dev["first"]]  # [D] (moved, for a chained step)
        drafts = self.table[dev["row"], last_pos + 1 + dev["col"]]  # [D]
        fb.input_ids[dev["first"] + 1 + dev["col"]] = drafts
        return runner.forward(fb), drafts


def device_oracle_speculation(k: int) -> Speculation:
    """Speculation drafting in the worker (`DeviceOracle`), chained behind steps in flight."""
    drafts = ModelDrafts()

    def drafter(req: Req) -> ModelDrafts:
        return drafts
    spec = Speculation(k, drafter)
    spec.chains = True
    return spec
