"""`PromptTokenizer`: tokenizes prompt text without stalling the api's event loop.

A long text is tokenized in a small thread pool (the Rust tokenizer releases the GIL, so
the loop keeps serving meanwhile); a short one on the loop, where a thread hop would cost
more than the tokenization. Other work that grows with the input (rendering a long chat
conversation with the chat template) goes through `run` to the same pool: pure Python
holds the GIL, but the loop still gets its turns every switch interval instead of none
until the work ends. A text too long to fit the prompt limit whatever it
tokenizes to is rejected before any tokenization: no token of the vocabulary spells more
than `max_token_chars` characters, so a text of more than `max_tokens *
max_token_chars` characters has more than `max_tokens` tokens.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from runtime.wire.errors import ContextLengthExceeded

INLINE_CHARS = 512  # up to here tokenizing (~1 us/char) costs less than a thread hop
THREADS = 2
T = TypeVar("T")


class PromptTokenizer:
    """`encode` prompt text into ids for a `tokenizer` (a Hugging Face tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        # vocabulary entries are the tokens' text (byte-level BPE: one char per byte, so
        # never fewer chars than the decoded text has)
        self.max_token_chars = max(len(t) for t in tokenizer.get_vocab())
        self._pool: ThreadPoolExecutor | None = None

    async def encode(
        self, text: str, max_tokens: int, *, add_special_tokens: bool = True
    ) -> list[int]:
        """The ids of `text`; `InvalidRequest` at once if it is surely over `max_tokens`
        tokens (the caller checks the exact count)."""
        limit = max_tokens * self.max_token_chars
        if len(text) > limit:
            raise ContextLengthExceeded(
                f"prompt is {len(text)} characters, more than the "
                f"{max_tokens} tokens a prompt may have can spell "
                f"({limit} characters at most)"
            )
        encode = functools.partial(
            self.tokenizer.encode, text, add_special_tokens=add_special_tokens
        )
        return await self.run(encode, len(text))

    async def run(self, work: Callable[[], T], chars: int) -> T:
        """`work()`, on the loop when its input is short (`chars` characters), else in the
        pool, so the loop keeps serving while it runs."""
        if chars <= INLINE_CHARS:
            return work()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="tokenize")
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    def close(self) -> None:
        """Stop the threads (a tokenization in progress finishes; queued ones are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
