"""`TokenBias`: the rows' `logit_bias` and `allowed_token_ids` as one additive table.

A row's entry [V] holds its biases, and -inf at every token outside its allowed set, so a
step applies both with one gather and one add on the device, reading nothing back. The
table is allocated the first time a request sets either field. A step none of whose rows
set them skips it entirely; in a step that mixes rows, a row without them gets zeros
added, which leaves its logits exactly as they were.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from runtime.wire.sampling import SamplingParams

Upload = Callable[[torch.Tensor], torch.Tensor]  # a host tensor on the device, no host sync


class TokenBias:
    """Per-row additive logit entries for a table of `max_rows` requests."""

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.max_rows, self.vocab_size, self.device = max_rows, vocab_size, device
        self._set = np.zeros(max_rows, dtype=bool)  # host flags: the row's entry is not zero
        self.table: torch.Tensor | None = None  # [rows, V] float32, once a row needs it

    def init_row(self, row: int, params: SamplingParams, upload: Upload) -> None:
        """Write `row`'s entry for a new request (validated `params`: ids in the vocabulary,
        a non-empty allowed set)."""
        bias, allowed = params.logit_bias, params.allowed_token_ids
        if not bias and allowed is None:
            if self._set[row]:
                self.table[row].zero_()
                self._set[row] = False
            return
        if self.table is None:
            self.table = torch.zeros(self.max_rows, self.vocab_size, device=self.device)
        entry = self.table[row]  # [V]
        if allowed is None:
            entry.zero_()
        else:
            entry.fill_(float("-inf"))
            entry.index_fill_(0, upload(torch.tensor(allowed, dtype=torch.int64)), 0.0)
        if bias:
            ids = upload(torch.tensor(list(bias), dtype=torch.int64))  # [n]
            values = upload(torch.tensor(list(bias.values()), dtype=torch.float32))  # [n]
            entry.index_add_(0, ids, values)  # -inf stays -inf: a bias cannot lift a ban
        self._set[row] = True

    def apply(self, logits: torch.Tensor, rows: np.ndarray, rows_dev: torch.Tensor) -> torch.Tensor:
        """`logits` [S, V] plus the entries of table rows `rows` [S] (`rows_dev` on the
        device); `logits` itself when none of these rows has an entry."""
        if self.table is None or not self._set[rows].any():
            return logits
        return logits + self.table[rows_dev]  # [S, V]
