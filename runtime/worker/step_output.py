"""`StepOutput`: one step's results on the device, and their way to the host.

A step yields the sampled ids, and when its requests asked for them: the sampled tokens'
logprobs, input logprobs, and the top alternatives (`SamplingParams.top_logprobs`) at
the sampled and at the input-logprob positions of the requests that asked; with a draft
model, the drafts it wrote. The parts
are concatenated on the device into one int64 and one float32 tensor, so the whole step
reaches the host in one enqueued copy per dtype, read only after the step's event: no
part adds a host sync. A step where no request asked for alternatives computes none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from runtime.wire.worker_channel import StepResult


def top_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each row of `logits` [N, V] (most likely first) and
    their logprobs under log_softmax: ids [N, k] int64, logprobs [N, k] float32."""
    values, ids = logits.topk(k, dim=-1)  # [N, k] x2, sorted descending
    return ids, values - torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, k] x2


def gather_top_logprobs(logits: torch.Tensor, index: np.ndarray,
                        k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`top_logprobs` of the rows `index` [N] (sorted, distinct) of `logits`: the index goes
    up without a host sync (a pinned copy on CUDA), and not at all when it takes every row."""
    if len(index) != len(logits):
        idx = torch.from_numpy(index)  # [N]
        if logits.device.type == "cuda":
            idx = idx.pin_memory().to(logits.device, non_blocking=True)
        logits = logits[idx]  # [N, V]
    return top_logprobs(logits, k)


def top_positions(top_n: np.ndarray, input_top_n: np.ndarray,
                  input_sizes: tuple[int, ...]) -> tuple[np.ndarray, int, int]:
    """Which logit rows need alternatives: the sampled rows whose request asked (`top_n`
    [S], alternatives asked per sampled row), then the input-logprob positions of the
    plan entries whose request asked (`input_top_n` [E], per entry; `input_sizes` [E]
    positions per entry, laid out after the S sampled rows). Returns the logit row
    indices [N + M], N (the sampled ones among them) and the stride K (the most asked)."""
    sampled = np.flatnonzero(top_n)  # [N]
    starts = len(top_n) + np.concatenate(([0], np.cumsum(input_sizes, dtype=np.int64)))
    spans = [np.arange(starts[e], starts[e + 1]) for e in np.flatnonzero(input_top_n)]
    index = np.concatenate([sampled, *spans]).astype(np.int64)  # [N + M]
    k = int(max(top_n.max(initial=0), input_top_n.max(initial=0)))
    return index, len(sampled), k


@dataclass
class StepOutput:
    """A step's result tensors (on the device until `to_host`), in StepResult's terms."""

    next_ids: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None = None  # [S] float32
    input_logprobs: torch.Tensor | None = None  # [L] float32
    input_sizes: tuple[int, ...] = ()  # L per BatchPlan.input_logprobs entry
    top_ids: torch.Tensor | None = None  # [N + M, K] int64: sampled rows, then input
    top_logprobs: torch.Tensor | None = None  # [N + M, K] float32
    num_top: int = 0  # N: rows of `top_*` that belong to sampled tokens
    draft_ids: torch.Tensor | None = None  # [D] int64: a draft model's drafts
    _ints: torch.Tensor | None = field(default=None, repr=False)  # packed, on the host
    _floats: torch.Tensor | None = field(default=None, repr=False)

    def _parts(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ints, floats = [self.next_ids], []
        if self.logprobs is not None:
            floats.append(self.logprobs)
        if self.input_logprobs is not None:
            floats.append(self.input_logprobs)
        if self.top_ids is not None:
            ints.append(self.top_ids.flatten())
            floats.append(self.top_logprobs.flatten())
        if self.draft_ids is not None:
            ints.append(self.draft_ids)
        return ints, floats

    def to_host(self, pinned: bool) -> StepOutput:
        """Enqueue the copy of every part to the host (pinned buffers when `pinned`, valid
        once the step's event completes): one copy per dtype."""
        ints, floats = self._parts()
        self._ints = _copy(ints, pinned)
        self._floats = _copy(floats, pinned) if floats else None
        return self

    def result(self, batch_id: int) -> StepResult:
        """The StepResult, from the host copies (`to_host` first; the event completed)."""
        s, k = len(self.next_ids), 0 if self.top_ids is None else self.top_ids.shape[1]
        ints = self._ints.tolist()
        drafts = []
        if self.draft_ids is not None:  # the last part
            split = len(ints) - len(self.draft_ids)
            ints, drafts = ints[:split], ints[split:]
        floats = self._floats.tolist() if self._floats is not None else []
        at = 0
        logprobs, inputs = [], []
        if self.logprobs is not None:
            logprobs, at = floats[:s], s
        for n in self.input_sizes if self.input_logprobs is not None else ():
            inputs.append(floats[at:at + n])
            at += n
        res = StepResult(batch_id, ints[:s], logprobs, inputs, draft_ids=drafts)
        if k:
            split = s + self.num_top * k
            top_lps = floats[at:]
            res.top_stride = k
            res.top_ids, res.input_top_ids = ints[s:split], ints[split:]
            res.top_logprobs = top_lps[:self.num_top * k]
            res.input_top_logprobs = top_lps[self.num_top * k:]
        return res


def _copy(parts: list[torch.Tensor], pinned: bool) -> torch.Tensor:
    """`parts` concatenated into one host tensor (enqueued without waiting when pinned)."""
    flat = parts[0] if len(parts) == 1 else torch.cat(parts)
    if not pinned:
        return flat
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    host.copy_(flat, non_blocking=True)
    return host
