"""`HeadForward`: one forward of an EAGLE head over some tokens of the target's step.

The head's entry of position q (q >= 1) is computed from the token at q and the target's
hidden state at q - 1: a function of the sequence's tokens up to q, as the target's KV of
position q is. So it is stored in the slot of position q, in a one-layer pool with the
target's slot numbering, and the scheduler's allocation, truncation, delayed release and
prefix sharing of a slot hold for it unchanged. Position 0 has no entry: a request's head
sequence is its positions 1.., at head positions (RoPE) q - 1, and its attention reads
the slots of those positions one by one (page size 1, whatever the target's page size),
gathered on the device from the target's page table.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.worker.batch_builder import BatchBuilder, exclusive_cumsum
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.speculative.chained import request_of, shifted_layout


class HeadForward:
    """`lens[i]` head tokens of request row `rows[i]` at positions `starts[i]` (>= 1)
    onwards, over the head's entries of positions 1..starts[i] - 1; the outputs of each
    request's last token are `sample_idx`. Its index arrays go into one `Staging.upload`
    under its name (`DraftForward.stage`)."""

    def __init__(self, name: str, rows: np.ndarray, starts: np.ndarray,
                 lens: np.ndarray) -> None:
        self.name = name
        seq = starts + lens - 1  # [B] head entries each token range ends with
        qo, kv_indptr = exclusive_cumsum(lens), exclusive_cumsum(seq)  # [B+1]
        n_tok = int(qo[-1])
        self.i64 = {"rows": rows, "tok_rows": np.repeat(rows, lens),  # [B], [T]
                    "pos": np.repeat(starts - qo[:-1], lens) + np.arange(n_tok),  # [T]
                    "tok_req": request_of(lens), "last": qo[1:] - 1}  # [T], [B]
        self.i32 = {"qo": qo, "kv_indptr": kv_indptr, "seq": seq, "pre": starts - 1}
        self.seq, self.pre, self.ext = seq.tolist(), (starts - 1).tolist(), lens.tolist()
        self.n_kv = int(kv_indptr[-1])

    def _dev(self, dev: dict[str, torch.Tensor],
             shift: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """This forward's arrays of the upload `dev`, each request's positions moved by
        `shift` [B] (chained steps, `chained`; None: none)."""
        d = {k: dev[f"{self.name}.{k}"] for k in (*self.i64, *self.i32)}
        if shift is not None:
            d["pos"] = d["pos"] + shift[d["tok_req"]]  # [T]
            d["pre"], d["seq"], _, d["kv_indptr"] = shifted_layout(d["pre"], d["seq"], shift, 1)
        return d

    def batch(self, dev: dict[str, torch.Tensor], builder: BatchBuilder,
              input_ids: torch.Tensor, shift: torch.Tensor | None = None) -> ForwardBatch:
        """The forward over `input_ids` [T] (`dev`: the step's upload; `shift`: `_dev`)."""
        d = self._dev(dev, shift)
        n = self.n_kv  # the most entries the forward reads (all, unless moved back)
        kv_pos = torch.arange(n, device=d["rows"].device)  # [N]
        seq = torch.searchsorted(d["kv_indptr"][1:].long(), kv_pos, right=True)  # [N]
        seq = seq.clamp(max=len(d["rows"]) - 1)  # [N]
        # positions 1.. of each sequence; past the moved-back end: position 1, never read
        kv_pos = torch.where(kv_pos < d["kv_indptr"][-1], kv_pos - d["kv_indptr"][seq] + 1, 1)
        return ForwardBatch(
            input_ids=input_ids, positions=d["pos"] - 1,
            out_slots=builder.slots(d["tok_rows"], d["pos"]), qo_indptr=d["qo"],
            kv_indptr=d["kv_indptr"], kv_indices=builder.slots(d["rows"][seq], kv_pos),
            seq_lens=d["seq"], prefix_lens=d["pre"], sample_idx=d["last"],
            is_decode=len(self.ext) == sum(self.ext), seq_lens_cpu=self.seq,
            prefix_lens_cpu=self.pre, extend_lens_cpu=self.ext, page_size=1, rows=d["rows"])

    def prev_slots(self, dev: dict[str, torch.Tensor], builder: BatchBuilder,
                   shift: torch.Tensor | None = None) -> torch.Tensor:
        """The slots of the positions before this forward's tokens [T]: where the target's
        hidden states they follow are kept."""
        d = self._dev(dev, shift)
        return builder.slots(d["tok_rows"], d["pos"] - 1)
