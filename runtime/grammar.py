"""Regex constraints compiled to token automata for the model's tokenizer, with xgrammar.

xgrammar (the grammar backend of SGLang and vLLM) turns a regex into a grammar, then, for
one tokenizer, into a `CompiledGrammar` whose `GrammarMatcher` yields the bitmask of
tokens that keep the text a prefix of a match. Parsing alone is cheap and catches every
syntax error, so the api checks regexes with `check_regex` before a request is queued;
the worker compiles with `RegexCompiler` (tens of ms to a few hundred for a new regex on
SmolLM2's 49k vocabulary, then cached) on a background thread that releases the GIL.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import Future, ThreadPoolExecutor

from runtime.messages import InvalidRequest

_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /path/file.cc:94: "


def check_regex(regex: str) -> None:
    """Raise `InvalidRequest` with the parser's message if `regex` is not a valid regex."""
    import xgrammar

    try:
        xgrammar.Grammar.from_regex(regex)
    except RuntimeError as e:
        message = _LOG_PREFIX.sub("", str(e).strip())
        raise InvalidRequest(f"invalid regex {regex!r}: {message}") from None


class RegexCompiler:
    """Compiles each regex once, on one background thread, for one tokenizer.

    `stop_ids` are the tokens that end a constrained output: a matcher allows them
    exactly when the text so far is a complete match. The tokenizer is loaded on the
    background thread too, on first use.
    """

    def __init__(self, tokenizer_path: str, vocab_size: int, stop_ids: list[int]) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.stop_ids = list(stop_ids)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="regex-compile")
        self._compiled: dict[str, Future] = {}
        self._compiler = None

    def submit(self, regex: str) -> Future:
        """A future of the `xgrammar.CompiledGrammar` of `regex` (shared by equal regexes)."""
        fut = self._compiled.get(regex)
        if fut is None:
            fut = self._compiled[regex] = self._pool.submit(self._compile, regex)
        return fut

    def _compile(self, regex: str):
        import xgrammar

        if self._compiler is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids)
            threads = min(4, os.cpu_count() or 1)
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=threads)
        return self._compiler.compile_regex(regex)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
