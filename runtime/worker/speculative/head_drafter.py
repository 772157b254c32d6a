"""`HeadDrafter`: the part of every step of a one-layer head that drafts from the
target's hidden states (`DraftHead`): an EAGLE head (`--speculative-algorithm eagle`,
`EagleHead`) or a checkpoint's multi-token-prediction layer (`mtp`, `MtpHead`; DeepSeek-V4's
`V4MtpHead`).

The head reads the target's hidden states. The target's forward returns each new token's
features (`ModelRunner.forward_features`: its final hidden state, the three residual
streams of EAGLE-3, or DeepSeek-V4's hyper-connection streams before their final collapse,
flattened), and the drafter keeps them, projected to one hidden state
(`DraftHead.project`), in a feature buffer indexed by KV slot: row s holds the target's
hidden state of the token at slot s. The row lives exactly as long as the slot's KV (the
scheduler's slot) and is written whenever the target computes that slot, so a prefix
shared from the cache, or the kept positions of a verify step, have theirs. The head's
KV pool has one layer of the head's own kind (K/V heads, a latent row under MLA, or V4's
K=V row).

After the target's forward (`absorb`), the head runs over the step's tokens at positions
q >= 1, each with the feature row of position q - 1, and stores its KV in the slots of q
(`HeadForward`): every position the target computed has its head entry, from the
target's own hidden states, before the next step reads it.

A verify step (`BatchPlan.draft_lens`) of a request whose last token is at position P
drafts before the target's forward (`propose`): step j (0 <= j < d) feeds token P + j
(the last token, or draft j) with the hidden state it follows (the feature row of P - 1
for j = 0, else the head's output of step j - 1), at position P + j over the head's
entries before it, and its greedy token is draft j + 1. Those steps write head entries
of P..P + d - 1 that `absorb` rewrites from the target's hidden states in the same step.
The drafts replace the plan's placeholders in the target's input, and the target's samples
decide what is kept (`Speculation`), so outputs never depend on the head. Nothing waits
for the device.

A head forward over one token a request (every draft step; `absorb` of a step of plain
decodes) replays a CUDA graph of the head (`HeadGraphs`), captured once the head's pool
exists when the target has graphs (a CUDA device, `--cuda-graph`, a backend that runs in
them), for as many rows and as long a context as the target's; the others (more rows
than the largest graph, a longer context, several tokens a request) run eagerly.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from runtime.wire.worker_channel import BatchPlan
from runtime.worker.attention import AttentionBackend
from runtime.worker.batch_builder import BatchBuilder, exclusive_cumsum
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.causal_lm import CausalLM
from runtime.worker.speculative.chained import chained_shift
from runtime.worker.speculative.draft_batch import (
    DraftForward,
    place_drafts,
    token_sources,
    verify_requests,
)
from runtime.worker.speculative.eagle_forward import HeadForward
from runtime.worker.speculative.head_graphs import HeadGraphs
from runtime.worker.staging import Staging


class DraftHead(Protocol):
    """A one-layer head over the target's hidden states (see the module docstring)."""

    capture: tuple[int, ...]  # the target's features it reads (`Decoder.run`); ()
    hidden_size: int  # of the hidden states a step reads and writes

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Memory a KV slot costs with this head: its pool's row and a feature row."""

    def attention(self, slots: int, backend: str, dtype: torch.dtype,
                  device: torch.device) -> AttentionBackend:
        """Attention backend `backend` over a new one-layer pool of `slots` slots."""

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [T, w] as the hidden states a head step reads [T, h]."""

    def __call__(self, embeds: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch,
                 attn: AttentionBackend) -> torch.Tensor:
        """One step over `fb`'s tokens, storing the head's KV: embeddings [T, h] and the
        hidden states they follow [T, h] -> the hidden states the next step reads [T, h]."""

    def draft_ids(self, out: torch.Tensor, target: CausalLM) -> torch.Tensor:
        """Greedy target token ids [T] int64 of a step's outputs `out` [T, h]."""


class HeadDrafter:
    """A loaded head (a `Drafter`); once `allocate`d, its KV pool and feature buffer over
    the target's slots (and the padding slot 0)."""

    def __init__(self, head: DraftHead, device: torch.device, dtype: torch.dtype) -> None:
        self.head, self.device, self.dtype = head, device, dtype
        self.capture = head.capture
        self.kv_bytes_per_token = head.bytes_per_token(dtype)
        self.staging = Staging(device)  # its own: the target's step tensors stay valid
        self.target: CausalLM | None = None
        self.pool: KVPool | None = None
        self.graphs: HeadGraphs | None = None

    def allocate(self, runner: ModelRunner, attention_backend: str) -> None:
        """The head's pool and feature buffer over the slots of `runner`'s pool, then its
        decode graphs where the target has some."""
        slots = runner.kv_slots + 1
        self.target = runner.model
        self.attn = self.head.attention(slots, attention_backend, self.dtype, self.device)
        self.pool = self.attn.pool
        self.features = torch.zeros(slots, self.head.hidden_size, dtype=self.dtype,
                                    device=self.device)  # [slots, hidden]
        target = runner.graphs
        if target is not None and self.attn.supports_graphs:
            self.graphs = HeadGraphs(self.head, self.target, self.attn, target.sizes[-1],
                                     target.max_context, self.device, self.dtype)
            self.graphs.capture()

    def slot_tensors(self) -> list[torch.Tensor]:
        """The head's pool and its feature rows."""
        return [*self.pool.layer_tensors(), self.features]

    def step(self, plan: BatchPlan, fb: ForwardBatch, builder: BatchBuilder,
             runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft (`propose`), run the target's forward, take its features (`absorb`):
        (the target's logits [S + L, V] float32, the drafts [D] or None)."""
        drafts = self.propose(plan, fb, builder)
        logits, features = runner.forward_features(fb)  # [S + L, V], [T, w]
        self.absorb(plan, fb, features, builder)
        return logits, drafts

    def _step(self, fb: ForwardBatch, hidden: torch.Tensor,
              draft: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One head forward over `fb` after the hidden states `hidden` [T, h], its KV
        stored: (its greedy ids [T], None eagerly unless `draft`; its outputs [T, h])."""
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.run(fb, hidden)  # [T], [T, h]
        self.attn.prepare(fb)
        embeds = self.target.model.embed_tokens(fb.input_ids)  # [T, h]
        out = self.head(embeds, hidden, fb, self.attn)  # [T, h]
        return (self.head.draft_ids(out, self.target) if draft else None), out

    @torch.inference_mode()
    def propose(self, plan: BatchPlan, fb: ForwardBatch,
                builder: BatchBuilder) -> torch.Tensor | None:
        """The drafts of the step's verify requests, written into `fb.input_ids` before
        the target's forward: [D] int64, draft_lens[i] per verify request in order (None:
        the step verifies nothing)."""
        if not plan.draft_lens:
            return None
        i64, d, verify = verify_requests(plan)
        rows, k = i64["rows"], int(d.max())  # [R]
        last_pos = np.array(plan.prefix_lens, dtype=np.int64)[verify]  # [R]
        back = np.array(plan.chain_back or [0] * len(plan.rows), dtype=np.int64)[verify]  # [R]
        i64 |= {"v_back": back, "prev_pos": last_pos - 1}
        steps = []
        for j in range(k):
            sel = np.flatnonzero(d > j)  # [R_j] the requests still drafting
            steps.append(HeadForward(f"step{j}", rows[sel], last_pos[sel] + j,
                                     np.ones_like(sel)))
            i64[f"sel{j}"] = sel
        dev = self.staging.upload(*DraftForward.stage(steps, i64))
        shift = self._shift(plan, builder, dev["rows"], dev["v_back"])  # [R] or None
        prev_pos = dev["prev_pos"] if shift is None else dev["prev_pos"] + shift  # [R]
        current = fb.input_ids[dev["first"]]  # [R] each request's input of the next step
        hidden = self.features[builder.slots(dev["rows"], prev_pos)]  # [R, h]
        grid = torch.zeros(len(d) * k, dtype=torch.int64, device=current.device)  # [R * k]
        for j, step in enumerate(steps):
            sel = dev[f"sel{j}"]  # [R_j]
            fwd = step.batch(dev, builder, current[sel], None if shift is None else shift[sel])
            ids, out = self._step(fwd, hidden[sel], draft=True)  # [R_j], [R_j, h]
            current[sel], hidden[sel] = ids, out
            grid[sel * k + j] = ids
        return place_drafts(grid, dev, fb)

    @torch.inference_mode()
    def absorb(self, plan: BatchPlan, fb: ForwardBatch, features: torch.Tensor,
               builder: BatchBuilder) -> None:
        """After the target's forward over `fb`: keep its `features` [T, w] by slot and
        write the head's entries of the step's positions (see the module docstring)."""
        self.features[fb.out_slots] = self.head.project(features)  # [T, h]
        rows = np.array(plan.rows, dtype=np.int64)  # [B]
        pre = np.array(plan.prefix_lens, dtype=np.int64)  # [B]
        ext = np.array(plan.extend_lens, dtype=np.int64)  # [B]
        skip = (pre == 0).astype(np.int64)  # [B] position 0 follows no hidden state
        keep = np.flatnonzero(ext > skip)  # [B'] requests with a position >= 1
        if not len(keep):
            return
        lens = ext[keep] - skip[keep]  # [B']
        fwd = HeadForward("absorb", rows[keep], pre[keep] + skip[keep], lens)
        first = exclusive_cumsum(ext)[keep] + skip[keep]  # [B'] their first head token in fb
        src = token_sources(first, lens, np.zeros_like(lens), fb.num_tokens)  # [T']
        back = np.array(plan.chain_back or [0] * len(rows), dtype=np.int64)[keep]  # [B']
        dev = self.staging.upload(*DraftForward.stage([fwd], {"src": src, "back": back}))
        shift = self._shift(plan, builder, dev["absorb.rows"], dev["back"])  # [B'] or None
        hidden = self.features[fwd.prev_slots(dev, builder, shift)]  # [T', h]
        self._step(fwd.batch(dev, builder, fb.input_ids[dev["src"]], shift), hidden,
                   draft=False)

    @staticmethod
    def _shift(plan: BatchPlan, builder: BatchBuilder, rows: torch.Tensor,
               back: torch.Tensor) -> torch.Tensor | None:
        """How far the positions of requests `rows` [R] move (`chained`), None when the
        step chains none."""
        if not plan.chain_back:
            return None
        return chained_shift(builder.verified.accepted, rows, back)  # [R]
