"""Detokenize the new ids of many requests together: one batched decode per round.

Each `IncrementalDetokenizer` step decodes two short windows (see `detokenize.py`). Per
`BatchOut`, `detokenize_batch` pushes the k-th new id of every request (round k; one round
when each request got one token), decodes all their windows in one call into the Rust
tokenizer, and lets each detokenizer accept its pair. The text is the same as
`IncrementalDetokenizer.add` per request, stop strings and held-back characters included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.api.detokenize import IncrementalDetokenizer


class BatchDecoder:
    """`tokenizer.decode` over many id lists in one call.

    Uses the `tokenizers` backend's `decode_batch` when the wrapper's decode is exactly the
    backend's (a fast tokenizer without `clean_up_tokenization_spaces`), else decodes one
    list at a time.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        clean = getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._batch = backend.decode_batch if backend is not None and not clean else None

    def decode(self, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
        if self._batch is not None:
            return self._batch(seqs, skip_special_tokens=skip_special_tokens)
        return [self._tok.decode(s, skip_special_tokens=skip_special_tokens) for s in seqs]


def detokenize_batch(decoder: BatchDecoder,
                     items: Sequence[tuple[IncrementalDetokenizer, Sequence[int]]]
                     ) -> list[str | Exception]:
    """Feed each detokenizer its new ids; per item, the text now safe to show (as `add`
    returns it) or the exception decoding its ids raised (other items are unaffected)."""
    failed: list[Exception | None] = [None] * len(items)
    k = 0
    while True:
        live = [i for i, (d, ids) in enumerate(items)
                if k < len(ids) and not d.finished and failed[i] is None]
        if not live:
            break
        for skip in (True, False):
            group = [i for i in live if items[i][0].skip_special_tokens is skip]
            if group:
                _round(decoder, items, group, k, skip, failed)
        k += 1
    return [e if e is not None else d.emit() for (d, _), e in zip(items, failed)]


def _round(decoder: BatchDecoder, items: Sequence[tuple[IncrementalDetokenizer, Sequence[int]]],
           group: list[int], k: int, skip: bool, failed: list[Exception | None]) -> None:
    """Push the k-th id of each item in `group`, decode every window at once, accept."""
    windows: list[list[int]] = []
    for i in group:
        windows.extend(items[i][0].push(items[i][1][k]))
    try:
        texts = decoder.decode(windows, skip)
    except Exception:  # a bad id somewhere: decode item by item so only its request fails
        texts = None
    for j, i in enumerate(group):
        pair = windows[2 * j:2 * j + 2]
        try:
            prefix, full = texts[2 * j:2 * j + 2] if texts is not None \
                else decoder.decode(pair, skip)
        except Exception as e:
            failed[i] = e
            continue
        items[i][0].accept(prefix, full)
