"""Output constraints compiled to token automata for the model's tokenizer, with xgrammar.

A constraint is a regex or a JSON schema, named by one grammar key
(`SamplingParams.grammar`: "regex:<regex>" or "json:<schema>"). xgrammar (the grammar
backend of SGLang and vLLM) turns it into a grammar, then, for one tokenizer, into a
`CompiledGrammar` whose `GrammarMatcher` yields the bitmask of tokens that keep the text
a prefix of a match. Parsing alone is cheap and catches every syntax error, so the api
checks a request's constraint with `check_grammar` before it is queued. JSON is
generated compact (no free whitespace), so a small model cannot pad it forever.

Compiling is not cheap: from a few ms to seconds for a new regex on SmolLM2's 49k
vocabulary (`[A-Za-z ]{1,200}[.]` takes about 2 s on a CPU core and 3 MB). It runs ahead
of the step that needs it, on `RegexCompiler`'s background thread in every worker (each
TP rank needs its own); xgrammar releases the GIL meanwhile, so steps go on:

  1. a request with a grammar the workers lack waits in the scheduler (`GrammarGate`),
     which sends a `GrammarCacheUpdate` asking every rank to compile it;
  2. each rank answers `GrammarCompiled` once its compile is done (or failed); the
     scheduler admits the request only when every rank has answered, or fails it with
     the compiler's message;
  3. the admitted row's matcher is built from the ready grammar: no step waits.

The alternative, compiling in the scheduler and shipping `CompiledGrammar.serialize_json`
with the row, costs more than it saves: the JSON of a grammar that compiles in 110 ms is
about 1 MB per rank and takes 45 ms to write and 20 ms to read back, and that read would
land on the worker's step loop (or need the same readiness protocol to avoid it).

The scheduler owns the cache's LRU order and size bound (`--grammar-cache-size`) and
tells the workers what to evict, so it always knows which grammars a row can use at
once; a live row keeps its matcher (and grammar) after an eviction.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import Future, ThreadPoolExecutor

from runtime.wire.errors import InvalidRequest
from runtime.wire.sampling import SamplingParams

_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /path/file.cc:94: "
REGEX, JSON = "regex:", "json:"  # the kinds of grammar key


def check_grammar(params: SamplingParams) -> None:
    """Raise `InvalidRequest` with the parser's message if the request's regex or JSON
    schema is not valid (nothing to check without one)."""
    import xgrammar

    if params.regex is not None:
        what, parse = f"regex {params.regex!r}", xgrammar.Grammar.from_regex
    elif params.json_schema is not None:
        what, parse = "json_schema", _json_grammar
    else:
        return
    try:
        parse(params.regex if params.regex is not None else params.json_schema)
    except RuntimeError as e:
        raise InvalidRequest(f"invalid {what}: {error_message(e)}") from None


def _json_grammar(schema: str):
    import xgrammar

    return xgrammar.Grammar.from_json_schema(schema, any_whitespace=False)


def error_message(error: BaseException) -> str:
    """xgrammar's message of `error`, without the log prefix its C++ side adds."""
    return _LOG_PREFIX.sub("", str(error).strip())


class GrammarCompiler:
    """The compiled grammars of one worker, for one tokenizer, compiled on one background
    thread, by grammar key; the scheduler decides which stay (`evict`), so this holds no
    bound itself.

    `stop_ids` are the tokens that end a constrained output: a matcher allows them
    exactly when the text so far is a complete match. The tokenizer is loaded on the
    background thread too, on first use.
    """

    def __init__(self, tokenizer_path: str, vocab_size: int, stop_ids: list[int]) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.stop_ids = list(stop_ids)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._compiled: dict[str, Future] = {}
        self._compiler = None

    def submit(self, key: str) -> Future:
        """A future of the `xgrammar.CompiledGrammar` of grammar `key`: the cached one,
        else a compile started now."""
        fut = self._compiled.get(key)
        if fut is None:
            fut = self._compiled[key] = self._pool.submit(self._compile, key)
        return fut

    def evict(self, key: str) -> None:
        """Forget grammar `key` (if held); rows already built from it keep working."""
        self._compiled.pop(key, None)

    def __len__(self) -> int:
        return len(self._compiled)

    def _compile(self, key: str):
        import xgrammar

        if self._compiler is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
            )
            threads = min(4, os.cpu_count() or 1)
            # no cache of xgrammar's own: ours is the only one, bounded by the scheduler
            self._compiler = xgrammar.GrammarCompiler(
                info, max_threads=threads, cache_enabled=False
            )
        if key.startswith(REGEX):
            return self._compiler.compile_regex(key[len(REGEX):])
        if key.startswith(JSON):
            return self._compiler.compile_grammar(_json_grammar(key[len(JSON):]))
        raise ValueError(f"unknown grammar key {key[:40]!r}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
