"""`DraftForward`: one forward of the draft model over part of the target's step.

The draft runs forwards of its own beside the target's: the greedy draft steps of the
verify requests and the mirror of the other requests (`DraftModel`), each over some of
the step's rows, a request's owed position in front of its tokens where the plan asks
(`BatchPlan.draft_backfill`). A `DraftForward` holds such a forward's host layout (the
index arrays, named for one `Staging.upload` of all of a step's draft forwards) and then
builds its `ForwardBatch` over the target's page table, which already holds the step's
pages.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder, exclusive_cumsum
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.speculative.chained import request_of, shifted_layout


class DraftForward:
    """`lens[i]` new tokens of request row `rows[i]` at positions `starts[i]` onwards, over
    the KV of the positions before them; the logits of each request's last token are the
    ones returned (`sample_idx`)."""

    def __init__(self, name: str, rows: np.ndarray, starts: np.ndarray, lens: np.ndarray,
                 page_size: int) -> None:
        self.name, self.page_size = name, page_size
        seq = starts + lens  # [B]
        pages = -(-seq // page_size)  # [B]
        qo, kv_indptr = exclusive_cumsum(lens), exclusive_cumsum(pages)  # [B+1]
        n_tok = int(qo[-1])
        self.i64 = {"rows": rows, "tok_rows": np.repeat(rows, lens),  # [B], [T]
                    "pos": np.repeat(starts - qo[:-1], lens) + np.arange(n_tok),  # [T]
                    "tok_req": request_of(lens),  # [T]
                    "pages": pages, "kv_starts": kv_indptr[:-1], "last": qo[1:] - 1}  # [B]
        self.i32 = {"qo": qo, "kv_indptr": kv_indptr, "seq": seq, "pre": starts}
        self.seq, self.pre, self.ext = seq.tolist(), starts.tolist(), lens.tolist()
        self.n_pages = int(kv_indptr[-1])

    @staticmethod
    def stage(forwards: list, i64: dict[str, np.ndarray],
              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The int64 and int32 arrays of one `Staging.upload`: `i64` and those of every
        forward of `forwards` (each with a `name`, `i64` and `i32`: a `DraftForward`, or
        an EAGLE head's `HeadForward`), under its name."""
        i32 = {}
        for f in forwards:
            i64 |= {f"{f.name}.{k}": a for k, a in f.i64.items()}
            i32 |= {f"{f.name}.{k}": a for k, a in f.i32.items()}
        return i64, i32

    def batch(self, dev: dict[str, torch.Tensor], builder: BatchBuilder,
              input_ids: torch.Tensor, shift: torch.Tensor | None = None) -> ForwardBatch:
        """The forward over `input_ids` [T] (`dev`: the upload of `stage`), each request's
        positions moved by `shift` [B] (chained steps, `chained`; None: none)."""
        d = {k: dev[f"{self.name}.{k}"] for k in (*self.i64, *self.i32)}
        if shift is not None:
            d["pos"] = d["pos"] + shift[d["tok_req"]]  # [T]
            d["pre"], d["seq"], d["pages"], d["kv_indptr"] = shifted_layout(
                d["pre"], d["seq"], shift, self.page_size)
            d["kv_starts"] = d["kv_indptr"][:-1].long()  # [B]
        return ForwardBatch(
            input_ids=input_ids, positions=d["pos"], out_slots=builder.slots(d["tok_rows"],
                                                                             d["pos"]),
            qo_indptr=d["qo"], kv_indptr=d["kv_indptr"],
            kv_indices=builder.kv_indices(d["rows"], d["pages"], d["kv_starts"], self.n_pages),
            seq_lens=d["seq"], prefix_lens=d["pre"], sample_idx=d["last"],
            is_decode=len(self.ext) == sum(self.ext), seq_lens_cpu=self.seq,
            prefix_lens_cpu=self.pre, extend_lens_cpu=self.ext, page_size=self.page_size)


def token_sources(first: np.ndarray, lens: np.ndarray, owed: np.ndarray,
                  n: int) -> np.ndarray:
    """Where each token of a draft forward comes from, as indices into `n` tokens
    followed by the owed tokens: request i takes its owed token first when `owed[i]` is 1
    (the owed tokens in request order), then `lens[i]` tokens from index `first[i]`."""
    total = lens + owed  # [B]
    qo = exclusive_cumsum(total)  # [B+1]
    src = np.repeat(first - owed - qo[:-1], total) + np.arange(qo[-1])  # [T]
    src[qo[:-1][owed > 0]] = n + np.arange(int(owed.sum()))
    return src


def draft_placement(first: np.ndarray, d: np.ndarray) -> dict[str, np.ndarray]:
    """Where the drafts of a verify step's requests go, as index arrays for `place_drafts`:
    request r's d[r] drafts are columns 0..d[r]-1 of its row of the [R, k] grid the draft
    steps fill (`src`), and the tokens after its last one, index `first[r]` among the
    step's tokens (`dst`)."""
    k = int(d.max())
    off = exclusive_cumsum(d)  # [R+1] each request's first draft among all of them
    return {"src": np.repeat(np.arange(len(d)) * k - off[:-1], d) + np.arange(off[-1]),
            "dst": np.repeat(first + 1 - off[:-1], d) + np.arange(off[-1])}


def verify_requests(plan: BatchPlan,
                    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The plan's verify requests [R]: their index arrays (`first`: each one's last token
    among the step's tokens, `rows`, and `draft_placement`'s), their drafts d [R] and
    their indices among the plan's requests [R]."""
    lens = np.array(plan.draft_lens, dtype=np.int64)  # [B]
    verify = np.flatnonzero(lens)  # [R]
    d = lens[verify]  # [R]
    first = exclusive_cumsum(np.array(plan.extend_lens, dtype=np.int64))[verify]  # [R]
    return draft_placement(first, d) | {
        "first": first, "rows": np.array(plan.rows, dtype=np.int64)[verify]}, d, verify


def place_drafts(grid: torch.Tensor, dev: dict[str, torch.Tensor],
                 fb: ForwardBatch) -> torch.Tensor:
    """The drafts [D] out of the draft steps' `grid` [R * k], also written over the
    placeholders of `fb.input_ids` (`dev`: the upload of `draft_placement`'s arrays)."""
    out = grid[dev["src"]]  # [D]
    fb.input_ids[dev["dst"]] = out
    return out
