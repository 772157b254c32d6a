"""Incremental detokenization with stop strings, per request.

Decoding token by token breaks characters that span tokens (byte-level BPE splits an
emoji or a CJK character over several tokens) and words whose leading space depends on
the token before. So we decode a short window of tokens twice:
`prefix_text = decode(ids[prefix_offset:read_offset])` (already emitted) and
`full = decode(ids[prefix_offset:])`; the new text is `full[len(prefix_text):]`, and it is
held back while it ends in U+FFFD (an unfinished UTF-8 sequence). The window starts with
a few prompt tokens so the first output token decodes in context.

With a fast tokenizer whose decode is exactly its Rust backend's (no
`clean_up_tokenization_spaces`), the `tokenizers` library's `DecodeStream` runs that same
window rule in Rust, one call per token and no Python lists; the window offsets are kept
here either way, so the end of a request (`flush`) and a token the stream refuses fall
back to the Python windows.

Stop strings are searched in the committed text (also across token boundaries) by a
`StopMatcher`, so a token costs the same however many stop strings a request has; while
any are set, the last `max(len(stop)) - 1` characters stay unsent, so a stream never
shows the start of a stop string that a later token completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

from runtime.api.stop_matcher import StopMatcher

PROMPT_CONTEXT = 5  # prompt tokens decoded ahead of the output


def stream_backend(tokenizer: Any) -> Any | None:
    """The Rust tokenizer a `DecodeStream` may decode with: one whose decode is exactly the
    wrapper's (a fast tokenizer without `clean_up_tokenization_spaces`), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend


class IncrementalDetokenizer:
    """Turns a request's output token ids into text deltas, stopping at stop strings.

    The deltas concatenate to the continuation of the prompt's text, cut before the
    first stop string; for byte-level BPE tokenizers (Llama 3, Qwen, SmolLM) that is
    exactly `tokenizer.decode(token_ids, skip_special_tokens=...)` cut at the stop.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int],
                 skip_special_tokens: bool = True, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._matcher = StopMatcher(self.stop) if self.stop else None
        context = list(prompt_ids[-PROMPT_CONTEXT:])
        if "\ufffd" in self._decode(context):  # prompt ends inside a character: no context
            context = []
        self._n_context = len(context)
        self._ids: list[int] = context  # context + accepted output ids
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._unsent = ""  # committed text not yet returned (always holds the stop window)
        self._backend = stream_backend(tokenizer)
        self._stream = None if self._backend is None else DecodeStream(
            ids=context, skip_special_tokens=skip_special_tokens)
        self.stop_str: str | None = None  # the stop string that ended the output
        self.finished = False

    @property
    def token_ids(self) -> list[int]:
        """Output ids accepted so far (those after a stop string's last token are dropped)."""
        return self._ids[self._n_context:]

    @property
    def num_tokens(self) -> int:
        return len(self._ids) - self._n_context

    def add(self, new_ids: Sequence[int]) -> str:
        """Take new output ids; return the text that is now safe to show.

        Ids are taken one at a time; when a stop string completes, the ids after the one
        that completed it are dropped, `stop_str` is set, the detokenizer is finished and
        all text before the stop string is returned.
        """
        for token_id in new_ids:
            if self.finished:
                break
            self._ids.append(token_id)
            if self._stream is not None:
                try:
                    piece = self._stream.step(self._backend, token_id)
                except Exception:  # e.g. a window whose text does not extend the last one
                    self._stream = None  # this id and the rest: Python windows
                else:
                    if piece is not None:
                        self._advance()
                        self._commit(piece)
                    continue
            prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
            full = self._decode(self._ids[self._prefix_offset:])
            # nothing new, or it ends inside a character: hold it until a later id
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                self._advance()
                self._commit(full[len(prefix):])
        return self.emit()

    def flush(self) -> str:
        """The request ended: return all remaining text (an unfinished character decodes
        to U+FFFD, as in a full decode). Stop strings are still honoured."""
        if not self.finished:
            prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
            full = self._decode(self._ids[self._prefix_offset:])
            self._prefix_offset = self._read_offset = len(self._ids)
            self._commit(full[len(prefix):])
            self.finished = True
        return self.emit()

    def emit(self) -> str:
        """The committed text that is now safe to show (all of it once finished)."""
        end = len(self._unsent) if self.finished else len(self._unsent) - self._hold
        if end <= 0:
            return ""
        out, self._unsent = self._unsent[:end], self._unsent[end:]
        return out

    def _advance(self) -> None:
        """The newest id completed text: the next windows start after the text so far."""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _commit(self, piece: str) -> None:
        """Append decoded text and cut it at the earliest stop string it completes."""
        if not piece:
            return
        start = len(self._unsent)
        self._unsent += piece
        found = self._matcher.feed(piece) if self._matcher is not None else None
        if found is not None:
            # a match starts at most len(stop) - 1 chars before `piece`: `_unsent` holds them
            offset, self.stop_str = found
            self._unsent = self._unsent[:start + offset]
            self.finished = True
