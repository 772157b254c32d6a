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
from runtime.worker.batch_builder import BatchBuilder
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.model_runner import ModelRunner
from runtime.worker.speculative.draft_batch import place_drafts, verify_requests
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
        i64, d, _ = verify_requests(plan)
        dev = self.staging.upload(i64, {})
        last = fb.positions[dev["first"]]  # [R] (moved, for a chained step)
        cols = last[:, None] + 1 + torch.arange(int(d.max()), device=last.device)  # [R, k]
        grid = self.table[dev["rows"][:, None], cols.clamp(max=self.table.shape[1] - 1)]
        drafts = place_drafts(grid.reshape(-1), dev, fb)  # [D], before the forward reads them
        return runner.forward(fb), drafts


def device_oracle_speculation(k: int) -> Speculation:
    """Speculation drafting in the worker (`DeviceOracle`), chained behind steps in flight."""
    drafts = ModelDrafts()

    def drafter(req: Req) -> ModelDrafts:
        return drafts
    spec = Speculation(k, drafter)
    spec.chains = True
    return spec
