"""`DraftModel`: a smaller model beside the target that writes a verify step's drafts.

Its KV pool has the target's slot numbering: slot s holds, in both pools, the KV of the
same token at the same position, so the scheduler's allocation, truncation and delayed
release of a slot cover both, and a prefix the radix cache shares is shared in both. To
keep that true the draft mirrors every forward the target runs (`mirror`: the same
tokens into the same slots), prefill chunks and plain decodes included.

In a verify step (`BatchPlan.draft_lens`), before the target's forward, `propose` runs
greedy decode steps of the draft for the verify requests: step j feeds the request's last
token (j = 0) or its draft j at position P + j (P: the last token's position), over the
draft KV of the positions before it, and takes the argmax as draft j + 1; a request with
d drafts takes part in steps 0..d-1, so the draft writes only positions the scheduler
allocated. The drafts replace the plan's placeholder ids in the target's input, and the
target's samples decide what is kept as for any drafter (`Speculation`): greedy drafts
are a function of the context alone, so keeping the target's own samples up to the first
mismatch gives plain decoding's tokens, seeded samples included. The mirror of the verify
forward then writes the draft KV of the last draft too. Nothing waits for the device.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.model_config import ModelSpec
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.kv_pool import KVPool, kv_bytes_per_token
from runtime.worker.loader import load_model
from runtime.worker.model_check import UnsupportedModel
from runtime.worker.model_runner import make_attention
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.staging import Staging


def _exclusive_cumsum(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


class DraftModel:
    """The draft's weights (loaded first, so the target's pool is sized after them) and,
    once `allocate`d, its KV pool over the target's slots."""

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

    def allocate(self, kv_slots: int, attention_backend: str) -> None:
        """The draft's pool: `kv_slots` + the padding slot 0, as the target's."""
        arch = self.model.arch
        self.pool = KVPool(arch.num_layers, kv_slots + 1, arch.num_kv_heads, arch.head_dim,
                           self.dtype, self.device)
        self.attn = make_attention(attention_backend, self.pool, self.device)

    @torch.inference_mode()
    def mirror(self, fb: ForwardBatch) -> None:
        """Write the draft KV of the target's step `fb` (its logits are not needed)."""
        self.attn.prepare(fb)
        self.model(fb, self.attn)

    @torch.inference_mode()
    def propose(self, plan: BatchPlan, fb: ForwardBatch, builder: BatchBuilder) -> torch.Tensor:
        """Draft the plan's verify requests' tokens into `fb.input_ids` (the target's step,
        built) and return them: [D] int64, draft_lens[i] per verify request, in order."""
        lens = np.array(plan.draft_lens, dtype=np.int64)  # [B]
        verify = np.flatnonzero(lens)  # [R]
        d = lens[verify]  # [R]
        rows = np.array(plan.rows, dtype=np.int64)[verify]  # [R]
        last_pos = np.array(plan.prefix_lens, dtype=np.int64)[verify]  # [R]
        first_tok = _exclusive_cumsum(np.array(plan.extend_lens, dtype=np.int64))[verify]
        k = int(d.max())
        i64 = {"last": first_tok,  # the last token's index among the step's tokens
               "src": np.concatenate([r * k + np.arange(n) for r, n in enumerate(d)]),
               "dst": np.concatenate([t + 1 + np.arange(n) for t, n in zip(first_tok, d)])}
        i32, seqs = {}, []
        for j in range(k):
            sel = np.flatnonzero(d > j)  # [R_j] the requests still drafting
            pos = last_pos[sel] + j  # [R_j]
            pages = -(-(pos + 1) // builder.page_size)  # [R_j]
            kv_indptr = _exclusive_cumsum(pages)
            i64 |= {f"sel{j}": sel, f"rows{j}": rows[sel], f"pos{j}": pos,
                    f"pages{j}": pages, f"kv_starts{j}": kv_indptr[:-1],
                    f"idx{j}": np.arange(len(sel))}
            i32 |= {f"qo{j}": np.arange(len(sel) + 1), f"kv_indptr{j}": kv_indptr,
                    f"seq{j}": pos + 1, f"pre{j}": pos}
            seqs.append(((pos + 1).tolist(), int(kv_indptr[-1])))
        dev = self.staging.upload(i64=i64, i32=i32)
        current = fb.input_ids[dev["last"]]  # [R] each request's input of the next step
        drafts = torch.zeros(len(d) * k, dtype=torch.int64, device=self.device)  # [R * k]
        for j, (seq, n_pages) in enumerate(seqs):
            sel = dev[f"sel{j}"]  # [R_j]
            step = self._decode_batch(builder, dev, j, current[sel], seq, n_pages)
            self.attn.prepare(step)
            hidden = self.model(step, self.attn)  # [R_j, hidden]
            ids = self.model.compute_logits(hidden).argmax(dim=-1)  # [R_j]
            current[sel] = ids
            drafts[sel * k + j] = ids
        out = drafts[dev["src"]]  # [D]
        fb.input_ids[dev["dst"]] = out
        return out

    @staticmethod
    def _decode_batch(builder: BatchBuilder, dev: dict[str, torch.Tensor], j: int,
                      input_ids: torch.Tensor, seq: list[int], n_pages: int) -> ForwardBatch:
        """Draft step j (`seq`: its sequences' lengths, `n_pages` their pages in all): one
        token a request at its position, over the pages the target's step put in the
        table."""
        rows, pos = dev[f"rows{j}"], dev[f"pos{j}"]
        return ForwardBatch(
            input_ids=input_ids, positions=pos, out_slots=builder.slots(rows, pos),
            qo_indptr=dev[f"qo{j}"], kv_indptr=dev[f"kv_indptr{j}"],
            kv_indices=builder.kv_indices(rows, dev[f"pages{j}"], dev[f"kv_starts{j}"],
                                          n_pages),
            seq_lens=dev[f"seq{j}"], prefix_lens=dev[f"pre{j}"], sample_idx=dev[f"idx{j}"],
            is_decode=True, seq_lens_cpu=seq, prefix_lens_cpu=[n - 1 for n in seq],
            extend_lens_cpu=[1] * len(seq), page_size=builder.page_size)
