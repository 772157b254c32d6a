"""`BatchBuilder`: turns a BatchPlan into a ForwardBatch over the worker's page table.

The worker mirrors each request row's pages (`req_to_page[row, i]`: the i-th page of the
request bound to `row`; page size 1 in token mode, where a page is a slot) and the token
each row last sampled (`last_ids`, what placeholder ids -(row + 1) resolve to). A plan
carries only what is new, so the host work of a step is proportional to the step's new
tokens and pages: a few vectorized numpy operations, one host-to-device copy per dtype,
then device gathers. Nothing waits for the device.

A step whose requests each compute one token, or a verify step's last token and its d
drafts (`BatchPlan.draft_lens`), with every request sampling and no input logprobs, is
built as a decode batch: request i with prefix P and n new tokens becomes n decode rows
(pseudo-rows), row j at position P + j over the first P + j + 1 positions of the
request's pages. That is exact: every layer stores all the step's K/V before attending,
so row j reads positions P..P + j of the same layer. Such a step runs the decode kernels
(and a CUDA graph) instead of the extend path, and its logits row of each token is its
decode row. Each pseudo-row reads its request's whole KV, so a verify step of n tokens
reads n times the KV an extend would: `max_decode_rows` caps the rows of such a step
(`ModelRunner.max_decode_rows`: the largest CUDA graph, or a fixed cap without graphs);
a larger step stays an extend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels.kv.page_gather import gather_pages, gather_pages_ref
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.lora.batch import LoraBatch, lora_segments
from runtime.worker.speculative.chained import (
    VerifyRecord,
    chained_shift,
    request_of,
    shifted_layout,
)
from runtime.worker.staging import Staging


@dataclass
class SampleInputs:
    """What sampling and input logprobs need of a step, beside the logits."""

    rows: np.ndarray  # [S] int64 host: the sampled requests' rows, in plan order
    rows_dev: torch.Tensor  # [S] int64: the same on the device
    positions: torch.Tensor  # [S] int64: the position each sampled token takes (seeded rows)
    logprob_targets: torch.Tensor  # [L] int64: prompt tokens scored by input logprobs
    logprob_sizes: tuple[int, ...]  # entries of L per BatchPlan.input_logprobs entry
    # verify steps (BatchPlan.draft_lens): of the S samples, each request's last [R]; None
    # when every sampled request samples once
    last_idx: torch.Tensor | None = None
    # verify steps: the index arrays of `VerifyRecord.record` on the device
    verify: dict[str, torch.Tensor] | None = None

    def last_samples(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [R], ids [R]): each sampled request's row and the last of its samples
        `ids` [S], which its placeholder resolves to."""
        if self.last_idx is None:
            return self.rows_dev, ids
        return self.rows_dev[self.last_idx], ids[self.last_idx]


VERIFY_KEYS = ("v_rows", "v_samp", "v_draft", "v_ok", "v_first")


def exclusive_cumsum(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


class BatchBuilder:
    """Device-side request tables and the step builder (see the module docstring)."""

    def __init__(self, max_rows: int, max_context: int, device: torch.device,
                 page_size: int = 1, lora_slots: int = 0, max_decode_rows: int = 0) -> None:
        self.device = device
        self.page_size = page_size
        # the most decode rows of a step of several tokens a request (0: never)
        self.max_decode_rows = max_decode_rows
        self.lora_slots = lora_slots  # LoRA adapter slots of the model (0: no LoRA)
        self.req_to_page = torch.zeros(max_rows, -(-max_context // page_size),
                                       dtype=torch.int64, device=device)  # [rows, pages]
        self.last_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)  # [rows]
        self.verified = VerifyRecord(max_rows, device)  # for steps chained behind a verify
        self._gather = gather_pages if device.type == "cuda" else gather_pages_ref
        self.staging = Staging(device)

    def build(self, plan: BatchPlan) -> tuple[ForwardBatch, SampleInputs]:
        """Write the plan's pages into the table and gather the step's indices."""
        ps = self.page_size
        rows = np.array(plan.rows, dtype=np.int64)  # [B]
        pre = np.array(plan.prefix_lens, dtype=np.int64)  # [B]
        ext = np.array(plan.extend_lens, dtype=np.int64)  # [B]
        seq = pre + ext  # [B]
        pages = -(-seq // ps)  # [B] pages of each sequence after this step
        first_new = -(-pre // ps)  # [B] index of the first page this step starts
        qo_indptr = exclusive_cumsum(ext)  # [B+1]
        n_tok = int(qo_indptr[-1])
        decode = self._decodes(plan, ext, n_tok)
        if decode and n_tok == len(rows):
            positions, tok_rows = pre, rows  # [T] == [B]
        else:
            positions = np.repeat(pre - qo_indptr[:-1], ext) + np.arange(n_tok)  # [T]
            tok_rows = np.repeat(rows, ext)  # [T]
        if decode:  # one sequence a token: its request's KV up to and including it
            a_rows, a_pre, a_seq = tok_rows, positions, positions + 1  # [T]
            a_qo, a_pages = np.arange(n_tok + 1), -(-a_seq // ps)  # [T+1], [T]
            a_pre_cpu, a_ext = a_pre.tolist(), [1] * n_tok
        else:
            a_rows, a_pre, a_seq, a_qo, a_pages = rows, pre, seq, qo_indptr, pages
            a_pre_cpu, a_ext = plan.prefix_lens, plan.extend_lens
        kv_indptr = exclusive_cumsum(a_pages)  # [A+1] over the attention's sequences
        n_pages = int(kv_indptr[-1])
        w_rows, w_cols, w_pages = self._table_writes(plan, rows, pages - first_new, first_new)
        sample = np.array(plan.sample, dtype=bool)  # [B]
        counts = sample.astype(np.int64)  # [B] samples per request
        if plan.draft_lens:  # a verify step samples its last d + 1 positions
            counts *= np.array(plan.draft_lens, dtype=np.int64) + 1
        s_indptr = exclusive_cumsum(counts)  # [B+1]
        n_s = int(s_indptr[-1])
        back = np.repeat(s_indptr[1:], counts) - np.arange(n_s)  # [S] 1 at each last sample
        logit_rows = [np.repeat(qo_indptr[1:], counts) - back]  # S sampled tokens first
        targets = []
        for i, first, tgt in plan.input_logprobs:  # then L input-logprob positions
            start = qo_indptr[i] + first - pre[i]
            logit_rows.append(np.arange(start, start + len(tgt)))
            targets.append(tgt)
        i64 = {
            "ids": np.array(plan.input_ids, dtype=np.int64), "positions": positions,
            "tok_rows": tok_rows, "rows": a_rows, "pages": a_pages, "kv_starts": kv_indptr[:-1],
            "w_rows": w_rows, "w_cols": w_cols, "w_pages": w_pages,
            "logit_rows": np.concatenate(logit_rows), "s_rows": np.repeat(rows, counts),
            "s_pos": np.repeat(seq, counts) - back + 1,
            "targets": np.array([t for tgt in targets for t in tgt], dtype=np.int64),
        }
        i32 = {"qo_indptr": a_qo, "kv_indptr": kv_indptr, "seq": a_seq, "pre": a_pre}
        lora = lora_segments(plan.lora_slots, ext, self.lora_slots) if plan.lora_slots else None
        if lora is not None:
            i64["lora_order"], i32["lora_indptr"] = lora[0], lora[1]
        if plan.draft_lens:
            i64["last_idx"] = s_indptr[1:][sample] - 1
            i64 |= VerifyRecord.arrays(plan, qo_indptr[:-1], s_indptr)
        if plan.chain_back:  # each token's, sequence's and sample's request
            tok_req = request_of(ext)  # [T]
            i64 |= {"c_rows": rows, "c_back": np.array(plan.chain_back, dtype=np.int64),
                    "c_tok": tok_req, "c_att": tok_req if decode else np.arange(len(rows)),
                    "c_s": request_of(counts)}
        d = self.staging.upload(i64=i64, i32=i32)
        if len(w_rows):
            self.req_to_page[d["w_rows"], d["w_cols"]] = d["w_pages"]
        if plan.chain_back:
            self._move_chained(d, ps)
        pos_d, tok_rows_d = d["positions"], d["tok_rows"]
        out_slots = self.slots(tok_rows_d, pos_d)  # [T]
        ids = d["ids"]  # [T], negative = future token of row -(id+1)
        input_ids = torch.where(ids < 0, self.last_ids[(-ids - 1).clamp(min=0)], ids)  # [T]
        kv_indices = self.kv_indices(d["rows"], d["pages"], d["kv_starts"], n_pages)  # [P]
        fb = ForwardBatch(
            input_ids=input_ids, positions=pos_d, out_slots=out_slots,
            qo_indptr=d["qo_indptr"], kv_indptr=d["kv_indptr"], kv_indices=kv_indices,
            seq_lens=d["seq"], prefix_lens=d["pre"], sample_idx=d["logit_rows"],
            is_decode=decode, seq_lens_cpu=a_seq.tolist(), prefix_lens_cpu=a_pre_cpu,
            extend_lens_cpu=a_ext, page_size=ps, rows=d["rows"])
        if lora is not None:
            fb.lora = LoraBatch(d["lora_order"], d["lora_indptr"], lora[1].tolist(), lora[2])
        inputs = SampleInputs(rows=np.repeat(rows, counts), rows_dev=d["s_rows"],
                              positions=d["s_pos"], logprob_targets=d["targets"],
                              logprob_sizes=tuple(len(t) for t in targets),
                              last_idx=d.get("last_idx"),
                              verify={k: d[k] for k in VERIFY_KEYS} if plan.draft_lens else None)
        return fb, inputs

    def _move_chained(self, d: dict[str, torch.Tensor], page_size: int) -> None:
        """Move the positions of the step's chained requests back by the drafts their
        previous step rejected (`chained`): the uploaded arrays `d` in place."""
        shift = chained_shift(self.verified.accepted, d["c_rows"], d["c_back"])  # [B]
        a_shift = shift[d["c_att"]]  # [A]
        d["positions"] = d["positions"] + shift[d["c_tok"]]  # [T]
        d["s_pos"] = d["s_pos"] + shift[d["c_s"]]  # [S]
        d["pre"], d["seq"], d["pages"], d["kv_indptr"] = shifted_layout(
            d["pre"], d["seq"], a_shift, page_size)
        d["kv_starts"] = d["kv_indptr"][:-1].long()  # [A]

    def record_verified(self, inputs: SampleInputs, ids: torch.Tensor,
                        input_ids: torch.Tensor) -> None:
        """After sampling `ids` [S] over `input_ids` [T]: what a step chained behind this
        one's verify requests reads (`VerifyRecord`)."""
        if inputs.verify is not None:
            self.verified.record(inputs.verify, ids, input_ids, self.last_ids)

    def _decodes(self, plan: BatchPlan, ext: np.ndarray, n_tok: int) -> bool:
        """Whether the step is built as a decode batch (see the module docstring): every
        request samples (a decode batch returns every token's logits: a CUDA graph returns
        all its rows), none asks input logprobs, and each computes one token, or, up to
        `max_decode_rows` tokens in all, its last token and its drafts."""
        if plan.input_logprobs or not all(plan.sample):
            return False
        if n_tok == len(ext):
            return True
        if not plan.draft_lens or n_tok > self.max_decode_rows:
            return False
        return bool((ext == np.array(plan.draft_lens, dtype=np.int64) + 1).all())

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The pool slot of each (row [T], position [T]) from the table: [T] int64."""
        ps = self.page_size
        if ps == 1:
            return self.req_to_page[rows, positions]  # [T]
        return self.req_to_page[rows, positions // ps] * ps + positions % ps  # [T]

    def kv_indices(self, rows: torch.Tensor, pages: torch.Tensor, starts: torch.Tensor,
                   n_pages: int) -> torch.Tensor:
        """Every page of every sequence, prefix included: the first `pages[i]` table
        entries of each row `rows[i]`, at `starts[i]` of the [n_pages] result."""
        return self._gather(self.req_to_page, rows, pages, starts, n_pages)

    @staticmethod
    def _table_writes(plan: BatchPlan, rows: np.ndarray, n_new: np.ndarray,
                      first_new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, page index, page id) of every table entry the plan sets: the cached
        prefixes' pages, then the pages the step's positions start."""
        new_pages = np.array(plan.new_pages, dtype=np.int64)  # [N]
        assert len(new_pages) == int(n_new.sum()), (len(new_pages), n_new)
        offsets = exclusive_cumsum(n_new)[:-1]
        w_rows = [np.repeat(rows, n_new)]
        w_cols = [np.repeat(first_new - offsets, n_new) + np.arange(len(new_pages))]
        w_pages = [new_pages]
        for row, prefix in plan.prefix_writes:
            w_rows.append(np.full(len(prefix), row, dtype=np.int64))
            w_cols.append(np.arange(len(prefix)))
            w_pages.append(np.array(prefix, dtype=np.int64))
        if len(w_rows) == 1:
            return w_rows[0], w_cols[0], w_pages[0]
        return np.concatenate(w_rows), np.concatenate(w_cols), np.concatenate(w_pages)

    def record(self, rows: torch.Tensor, ids: torch.Tensor) -> None:
        """Remember the sampled ids [S] as rows' [S] future tokens (stream-ordered)."""
        if len(ids):
            self.last_ids[rows] = ids
