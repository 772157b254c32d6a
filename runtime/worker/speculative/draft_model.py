"""`DraftModel`: a smaller model beside the target that writes a verify step's drafts.

Its KV pool has the target's slot numbering: slot s holds, in both pools, the KV of the
same token at the same position, so the scheduler's allocation, truncation and delayed
release of a slot cover both, and a prefix the radix cache shares is shared in both.

A step's verify requests (`BatchPlan.draft_lens`) get greedy decode steps of the draft
before the target's forward: step j feeds the request's last token (j = 0) or its draft
j at position P + j (P: the last token's position), over the draft KV of the positions
before it, and takes the argmax as draft j + 1; a request with d drafts takes part in
steps 0..d-1, so the draft writes only positions the scheduler allocated. The drafts
replace the plan's placeholder ids in the target's input, and the target's samples decide
what is kept as for any drafter (`Speculation`): greedy drafts are a function of the
context alone, so keeping the target's own samples up to the first mismatch gives plain
decoding's tokens, seeded samples included.

The draft steps write the draft KV of positions P..P + d - 1, which is all a verify step
keeps unless every draft is accepted: then position P + d holds the last draft, whose
draft KV no step wrote. The scheduler knows it and names that token in the request's
next step (`BatchPlan.draft_backfill`), which feeds it at its position in front of the
request's first token there: in draft step 0 of a verify step (1-2 tokens a request), or
in the mirror. The mirror is the draft's forward over the step's other requests (prefill
chunks, plain decodes: the same tokens into the same slots as the target's). So a verify
request costs the draft its d steps and nothing more, and every position whose KV can be
read again (by the request's next step, or from the prefix cache, which never gets an
owed position) has its draft KV. The draft runs before the target's forward, its verify
requests' steps first: a prefix hit in the same step may read a position owed until
then. Nothing waits for the device.

A forward of the draft that feeds one token a request (a decode batch: draft steps
j >= 1, step 0 when none of its requests owes a token, a mirror of plain decodes) replays
a CUDA graph of the draft (`GraphRunner`, `greedy`: its ids), captured once the draft's
pool exists when the target has graphs (a CUDA device, `--cuda-graph`, a backend that
runs in them), for as many rows, as long a context and the same page size as the
target's; padding rows write the draft pool's slot 0. The other forwards (an owed token
in front, more rows than the largest graph, a longer context) run eagerly.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.model_config import ModelSpec
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder, exclusive_cumsum
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.graph_runner import GraphRunner
from runtime.worker.kv_pool import KVPool, kv_bytes_per_token
from runtime.worker.loader import load_model
from runtime.worker.model_check import UnsupportedModel
from runtime.worker.model_runner import ModelRunner, make_attention
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.speculative.chained import chained_shift
from runtime.worker.speculative.draft_batch import (
    DraftForward,
    draft_placement,
    place_drafts,
    token_sources,
)
from runtime.worker.staging import Staging


class DraftModel:
    """The draft's weights (loaded first, so the target's pool is sized after them) and,
    once `allocate`d, its KV pool over the target's slots: a `Drafter`."""

    capture = None  # it reads nothing of the target's forward but the logits

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> None:
        self.device, self.dtype = device, dtype
        self.model = load_model(spec, device, dtype, seed)
        if isinstance(self.model, DeepseekForCausalLM):
            raise UnsupportedModel(f"{spec.config_source}: a draft model with latent "
                                   "attention is not supported")
        arch = self.model.arch
        self.kv_bytes_per_token = kv_bytes_per_token(arch.num_layers, arch.num_kv_heads,
                                                     arch.head_dim, dtype)
        self.staging = Staging(device)  # its own: the target's step tensors stay valid
        self.pool: KVPool | None = None
        self.attn = None
        self.graphs: GraphRunner | None = None

    def allocate(self, runner: ModelRunner, attention_backend: str) -> None:
        """The draft's pool over the target's slots (and the padding slot 0), then its
        decode graphs where the target has some."""
        arch = self.model.arch
        self.pool = KVPool(arch.num_layers, runner.kv_slots + 1, arch.num_kv_heads,
                           arch.head_dim, self.dtype, self.device)
        self.attn = make_attention(attention_backend, self.pool, self.device)
        target = runner.graphs
        if target is not None and self.attn.supports_graphs:
            self.graphs = self.graph_runner(target.sizes[-1], target.max_context,
                                            target.page_size)
            self.graphs.capture()

    def graph_runner(self, rows: int, max_context: int, page_size: int) -> GraphRunner:
        """The draft's decode graphs of up to `rows` rows (not yet captured): each
        returns its rows' greedy ids."""
        return GraphRunner(self.model, self.attn, rows, max_context, self.device, page_size,
                           greedy=True)

    def slot_tensors(self) -> list[torch.Tensor]:
        return self.pool.layer_tensors()

    def step(self, plan: BatchPlan, fb: ForwardBatch, builder: BatchBuilder,
             runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft's part of the step (`run_step`), then the target's forward: (its
        logits [S + L, V] float32, the drafts [D] or None)."""
        drafts = self.run_step(plan, fb, builder)
        return runner.forward(fb), drafts

    @torch.inference_mode()
    def run_step(self, plan: BatchPlan, fb: ForwardBatch,
                 builder: BatchBuilder) -> torch.Tensor | None:
        """The draft's part of the target's step `plan` (built: `fb`), run before the
        target's forward: the verify requests' drafts into `fb.input_ids`, then the other
        requests' draft KV. Returns the drafts, [D] int64, draft_lens[i] per verify request
        in order (None: the step verifies nothing)."""
        if not plan.draft_lens and not plan.draft_backfill:
            self._forward(fb)  # nothing verified, nothing owed: the target's batch as it is
            return None
        n = len(plan.rows)
        lens = np.array(plan.draft_lens or [0] * n, dtype=np.int64)  # [B]
        owed = np.array(plan.draft_backfill or [-1] * n, dtype=np.int64)  # [B]
        rows = np.array(plan.rows, dtype=np.int64)  # [B]
        pre = np.array(plan.prefix_lens, dtype=np.int64)  # [B]
        ext = np.array(plan.extend_lens, dtype=np.int64)  # [B]
        first = exclusive_cumsum(ext)[:-1]  # [B] each request's first token in fb
        back = np.array(plan.chain_back or [0] * n, dtype=np.int64)  # [B]
        ps, i64 = builder.page_size, {}
        verify, plain = np.flatnonzero(lens), np.flatnonzero(lens == 0)  # [R], [M]
        steps = self._draft_steps(verify, lens, owed, back, rows, pre, first, ps, i64)
        mirror = None
        if len(plain):
            has = (owed[plain] >= 0).astype(np.int64)  # [M]
            mirror = DraftForward("mirror", rows[plain], pre[plain] - has, ext[plain] + has,
                                  ps)
            i64 |= {"m_owed": owed[plain][has > 0],
                    "m_src": token_sources(first[plain], ext[plain], has, fb.num_tokens)}
        forwards = steps + ([mirror] if mirror is not None else [])
        dev = self.staging.upload(*DraftForward.stage(forwards, i64))
        shift = None  # [R] how far each verify request's positions move (`chained`)
        if plan.chain_back and steps:
            shift = chained_shift(builder.verified.accepted, dev["v_rows"], dev["v_back"])
        drafts = self._propose(steps, dev, fb, builder, shift) if steps else None
        if mirror is not None:
            ids = torch.cat([fb.input_ids, dev["m_owed"]])[dev["m_src"]]  # [T_m]
            self._forward(mirror.batch(dev, builder, ids))
        return drafts

    def _forward(self, fb: ForwardBatch) -> None:
        """Run the draft over `fb`, storing its KV."""
        if self.graphs is not None and self.graphs.can_run(fb):
            self.graphs.replay(fb)
            return
        self.attn.prepare(fb)
        self.model(fb, self.attn)

    def _greedy(self, fb: ForwardBatch) -> torch.Tensor:
        """Run the draft over `fb`, storing its KV: each request's greedy next token [B]
        (a view of the graph's output when replayed)."""
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.replay(fb)[0]  # [B]
        self.attn.prepare(fb)
        hidden = self.model(fb, self.attn)  # [T, hidden]
        if not fb.is_decode:  # step 0 with owed tokens: each request's last
            hidden = hidden[fb.sample_idx]  # [B, hidden]
        return self.model.compute_logits(hidden).argmax(dim=-1)  # [B]

    @staticmethod
    def _draft_steps(verify: np.ndarray, lens: np.ndarray, owed: np.ndarray, back: np.ndarray,
                     rows: np.ndarray, pre: np.ndarray, first: np.ndarray, page_size: int,
                     i64: dict[str, np.ndarray]) -> list[DraftForward]:
        """The greedy draft steps of the verify requests `verify` [R] (step j: those with
        more than j drafts), their index arrays added to `i64`. A chained request
        (`back` > 0) feeds in step 0 the input before its first token, known on the device
        only (`VerifyRecord.prev_in`): its draft KV is owed when its previous step kept
        every draft, and rewritten unchanged otherwise."""
        if not len(verify):
            return []
        d = lens[verify]  # [R]
        k = int(d.max())
        chained = back[verify] > 0  # [R]
        has = ((owed[verify] >= 0) | chained).astype(np.int64)  # [R] step 0 feeds 2 tokens
        last_pos = pre[verify]  # [R]
        i64 |= draft_placement(first[verify], d)
        i64 |= {"last": first[verify],  # the last token's index among the step's tokens
                "v_rows": rows[verify], "v_back": back[verify],
                "v_owed": owed[verify][has > 0], "v_owed_rows": rows[verify][has > 0],
                "v_owed_dev": chained[has > 0].astype(np.int64),
                "v_src": token_sources(np.arange(len(d)), np.ones_like(d), has, len(d))}
        steps = []
        for j in range(k):
            sel = np.flatnonzero(d > j)  # [R_j] the requests still drafting
            extra = has[sel] if j == 0 else np.zeros_like(sel)  # [R_j]
            steps.append(DraftForward(f"step{j}", rows[verify][sel], last_pos[sel] + j - extra,
                                      1 + extra, page_size))
            i64[f"sel{j}"] = sel
        return steps

    def _propose(self, steps: list[DraftForward], dev: dict[str, torch.Tensor],
                 fb: ForwardBatch, builder: BatchBuilder,
                 shift: torch.Tensor | None) -> torch.Tensor:
        """Run the draft steps (each request's positions moved by `shift` [R]): their
        drafts into `fb.input_ids`, and returned ([D])."""
        k = len(steps)
        current = fb.input_ids[dev["last"]]  # [R] each request's input of the next step
        drafts = torch.zeros(len(current) * k, dtype=torch.int64,
                             device=self.device)  # [R * k]
        owed = torch.where(dev["v_owed_dev"] > 0,
                           builder.verified.prev_in[dev["v_owed_rows"]], dev["v_owed"])  # [O]
        for j, step in enumerate(steps):
            sel = dev[f"sel{j}"]  # [R_j]
            ids = torch.cat([current, owed])[dev["v_src"]] if j == 0 else current[sel]
            fwd = step.batch(dev, builder, ids, None if shift is None else shift[sel])
            ids = self._greedy(fwd)  # [R_j]
            current[sel] = ids
            drafts[sel * k + j] = ids
        return place_drafts(drafts, dev, fb)

