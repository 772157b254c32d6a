"""`NgramOnDevice`: prompt lookup (`--speculative-algorithm ngram`) in the worker, so its
verify steps chain behind the step in flight as a draft model's do (`Speculation.chains`).

The drafter keeps one token id per KV slot (`tokens`, `[slots + 1]`: the padding slot 0
too): every step writes the ids of every token the target computes into their slots, the
drafts included, before the target's forward. A slot's id lives exactly as long as its KV,
so a prefix shared from the cache, or the kept drafts of a verify step, have theirs.

A verify step of a request whose last token sits at position P (on the device: moved
for a chained step) gathers its sequence, positions 0..P, through the page table, padded
to the step's longest worst case (the plan's positions) and masked past P. It looks up
the latest earlier occurrence of the sequence's last n tokens for the longest n in
[min_n, max_n] (an occurrence ends before P: the suffix never matches itself) and drafts
the tokens that followed it: the very drafts of the host's `NgramDrafter` where that one
finds a match. A row without a match, or whose match's continuation runs past P, drafts
whatever fills its row; the target rejects those drafts. Every step is a fixed number of
tensor ops whose shapes the host knows, reading no device value on the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.model_runner import ModelRunner
from runtime.worker.speculative.draft_batch import place_drafts, verify_requests
from runtime.worker.staging import Staging


def ngram_drafts(seq: torch.Tensor, last: torch.Tensor, k: int, min_n: int,
                 max_n: int) -> torch.Tensor:
    """Drafts [R, k] int64 for sequences `seq` [R, L] (ids >= 0; row r's tokens are
    positions 0..last[r], the rest is ignored): the k tokens after the latest earlier
    occurrence of its last n tokens, for the longest n in [min_n, max_n] that occurred.
    Rows without one draft tokens of their own sequence."""
    R, L = seq.shape
    pos = torch.arange(L, device=seq.device)  # [L]
    # match[r, e]: the n tokens ending just before e equal row r's last n tokens, and end
    # before the suffix's own (e <= last)
    match = pos[None, :] <= last[:, None]  # [R, L]
    stop = torch.full((R,), -1, dtype=torch.int64, device=seq.device)  # [R] best end
    for n in range(1, max_n + 1):
        # the suffix's n-th token from the end, and the token n before each end (-1: none)
        want = seq.gather(1, (last - (n - 1)).clamp(min=0)[:, None])  # [R, 1]
        ahead = F.pad(seq, (n, 0), value=-1)[:, :L]  # [R, L]
        match &= ahead == want
        if n >= min_n:
            latest = torch.where(match, pos, -1).amax(1)  # [R]
            stop = torch.where(latest >= 0, latest, stop)  # a longer n wins
    idx = (stop[:, None] + torch.arange(k, device=seq.device)).clamp(min=0)  # [R, k]
    return seq.gather(1, torch.minimum(idx, last[:, None]))  # [R, k]


class NgramOnDevice:
    """A `Drafter` looking its verify requests' drafts up in their own sequences (see the
    module docstring); once `allocate`d, a token id per slot of the target's pool."""

    capture = None
    kv_bytes_per_token = 8  # one int64 id a slot

    def __init__(self, min_n: int, max_n: int, device: torch.device) -> None:
        assert 1 <= min_n <= max_n, (min_n, max_n)
        self.min_n, self.max_n, self.device = min_n, max_n, device
        self.staging = Staging(device)  # its own: the target's step tensors stay valid
        self.tokens: torch.Tensor | None = None

    def allocate(self, runner: ModelRunner, attention_backend: str) -> None:
        """The token ids over the slots of `runner`'s pool."""
        self.tokens = torch.zeros(runner.kv_slots + 1, dtype=torch.int64,
                                  device=self.device)  # [slots]

    def slot_tensors(self) -> list[torch.Tensor]:
        """The token ids, as rows of one id (`[slots, 1]`, a view)."""
        return [self.tokens[:, None]]

    @torch.inference_mode()
    def step(self, plan: BatchPlan, fb: ForwardBatch, builder: BatchBuilder,
             runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Keep the step's token ids by slot, draft (`propose`), run the target's forward:
        (its logits [S + L, V] float32, the drafts [D] or None)."""
        self.tokens[fb.out_slots] = fb.input_ids
        drafts = self.propose(plan, fb, builder)
        return runner.forward(fb), drafts

    def propose(self, plan: BatchPlan, fb: ForwardBatch,
                builder: BatchBuilder) -> torch.Tensor | None:
        """The drafts of the step's verify requests, written into `fb.input_ids` and their
        slots' ids: [D] int64, draft_lens[i] per verify request in order (None: the step
        verifies nothing)."""
        if not plan.draft_lens:
            return None
        return self.draft(*self.stage(plan), fb, builder)

    def stage(self, plan: BatchPlan) -> tuple[dict[str, torch.Tensor], int, int]:
        """The host's part of `propose`: the verify requests' index arrays on the device,
        the longest sequence they may have (the plan's last positions, the most a chained
        step's can be) and the most drafts of one."""
        i64, d, _ = verify_requests(plan)
        length = max(p for p, n in zip(plan.prefix_lens, plan.draft_lens) if n) + 1
        return self.staging.upload(i64, {}), length, int(d.max())

    def draft(self, dev: dict[str, torch.Tensor], length: int, k: int, fb: ForwardBatch,
              builder: BatchBuilder) -> torch.Tensor:
        """The device's part of `propose` (`dev`, `length`, `k`: `stage`'s): tensor ops
        only, reading no device value on the host."""
        last = fb.positions[dev["first"]]  # [R] (moved, for a chained step)
        at = torch.minimum(torch.arange(length, device=last.device), last[:, None])  # [R, L]
        seq = self.tokens[builder.slots(dev["rows"][:, None].expand_as(at), at)]  # [R, L]
        grid = ngram_drafts(seq, last, k, self.min_n, self.max_n)  # [R, k]
        drafts = place_drafts(grid.reshape(-1), dev, fb)  # [D]
        self.tokens[fb.out_slots[dev["dst"]]] = drafts
        return drafts
