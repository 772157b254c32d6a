"""`SamplingParams`: how to sample one request, with its validation and limits.

The one record that travels from the HTTP route (or RPC, or `Engine`) to the sampler.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

from runtime.wire.errors import InvalidRequest

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# an int the scheduler and worker can hold: decoding a wider one is a validation error
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
MAX_STOP_STRINGS = 16  # per request (OpenAI allows 4)
MAX_STOP_CHARS = 1024  # the stop strings of a request together
MAX_TOP_LOGPROBS = 20  # alternatives per scored token (OpenAI's chat bound)
MAX_LOGIT_BIAS = 100.0  # |logit_bias| bound (OpenAI's)


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to sample one request. `temperature=0` is greedy."""

    max_tokens: Int64 = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Int64 = -1  # -1 or 0: disabled
    min_p: float = 0.0
    seed: Int64 | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = []  # at most MAX_STOP_STRINGS, MAX_STOP_CHARS in all
    stop_token_ids: list[Int64] = []
    ignore_eos: bool = False
    logprobs: bool = False
    # The most likely alternatives of each scored token (output, and input from
    # `logprob_start_len` on), at most MAX_TOP_LOGPROBS; > 0 implies `logprobs`.
    top_logprobs: Int64 = 0
    skip_special_tokens: bool = True
    priority: Int64 = 0
    # Input (prompt) logprobs: the logprob of every prompt token from this position on,
    # given the tokens before it (-1: off). Position 0 has no logprob (nothing precedes
    # it): 0 means the same as 1. The prefix cache is not used from here on.
    logprob_start_len: Int64 = -1
    # Constrain the output to a full match of this regex (ends with EOS once complete).
    regex: str | None = None
    # Constrain the output to JSON valid under this JSON schema (a JSON text); at most one
    # of `regex` and `json_schema`.
    json_schema: str | None = None
    # Added to the logits before penalties, masks and temperature: token id -> bias in
    # [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (-100 all but bans a token, 100 all but forces it).
    logit_bias: dict[Int64, float] = {}
    # Only these tokens may be sampled (None: any); not with `regex` or `json_schema`.
    allowed_token_ids: list[Int64] | None = None
    # The LoRA adapter to run the request with, by its `--lora-paths` name (None: the base
    # model alone).
    lora: str | None = None

    def validate(self) -> None:
        """Raise `InvalidRequest` naming the first bad field."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("max_tokens", "top_k", "seed", "priority", "logprob_start_len",
                     "top_logprobs"):
            value = getattr(self, name)
            if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
                raise InvalidRequest(f"{name} must be a 64-bit int (in [-2**63, 2**63 - 1])")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed, "
                                 f"got {len(self.stop)}")
        checks = [
            (isinstance(self.max_tokens, int) and self.max_tokens >= 0, "max_tokens must be >= 0"),
            (_finite(self.temperature) and self.temperature >= 0, "temperature must be >= 0"),
            (_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (isinstance(self.top_k, int) and self.top_k >= -1, "top_k must be -1 (off) or >= 0"),
            (_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (_finite(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
             "frequency_penalty must be in [-2, 2]"),
            (_finite(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
             "presence_penalty must be in [-2, 2]"),
            (_finite(self.repetition_penalty) and self.repetition_penalty > 0,
             "repetition_penalty must be > 0"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty"),
            (sum(len(s) for s in self.stop if isinstance(s, str)) <= MAX_STOP_CHARS,
             f"stop strings may have at most {MAX_STOP_CHARS} characters in all"),
            (all(isinstance(t, int) and 0 <= t <= INT64_MAX for t in self.stop_token_ids),
             "stop_token_ids must be non-negative 64-bit ints"),
            (isinstance(self.logprob_start_len, int) and self.logprob_start_len >= -1,
             "logprob_start_len must be -1 (off) or >= 0"),
            (self.regex is None or (isinstance(self.regex, str) and self.regex != ""),
             "regex must be a non-empty string"),
            (isinstance(self.top_logprobs, int)
             and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
             f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]"),
            (self.json_schema is None
             or (isinstance(self.json_schema, str) and self.json_schema != ""),
             "json_schema must be a non-empty string"),
            (self.regex is None or self.json_schema is None,
             "give at most one of regex and json_schema"),
            (self.lora is None or (isinstance(self.lora, str) and 0 < len(self.lora) <= 64),
             "lora must be an adapter name (1 to 64 characters)"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)
        self._check_token_sets()
        if self.top_logprobs:
            self.logprobs = True

    def _check_token_sets(self) -> None:
        """`logit_bias` and `allowed_token_ids` (their ids' range: `check_vocab`)."""
        if self.logit_bias is None:
            self.logit_bias = {}
        bias, allowed = self.logit_bias, self.allowed_token_ids
        if not isinstance(bias, dict):
            raise InvalidRequest("logit_bias must map token ids to biases")
        for token, value in bias.items():
            if not _token_id(token):
                raise InvalidRequest(f"logit_bias keys must be token ids (ints >= 0), "
                                     f"got {token!r}")
            if not (_finite(value) and abs(value) <= MAX_LOGIT_BIAS):
                raise InvalidRequest(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, "
                                     f"{MAX_LOGIT_BIAS:g}], got {value!r} for token {token}")
        if allowed is None:
            return
        if not isinstance(allowed, list) or not allowed:
            raise InvalidRequest("allowed_token_ids must be a non-empty list of token ids")
        if not all(_token_id(t) for t in allowed):
            raise InvalidRequest("allowed_token_ids must be token ids (ints >= 0)")
        if self.grammar is not None:
            raise InvalidRequest("allowed_token_ids cannot be combined with regex or "
                                 "json_schema")

    def check_vocab(self, vocab_size: int) -> None:
        """Raise `InvalidRequest` if `logit_bias` or `allowed_token_ids` (validated) names a
        token outside the vocabulary [0, vocab_size)."""
        for name, ids in (("logit_bias", self.logit_bias),
                          ("allowed_token_ids", self.allowed_token_ids or ())):
            if ids and max(ids) >= vocab_size:
                raise InvalidRequest(f"{name} token id {max(ids)} is outside the vocabulary "
                                     f"[0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def grammar(self) -> str | None:
        """The output constraint as one grammar key (`GrammarCacheUpdate`): "regex:<regex>"
        or "json:<schema>", or None when the output is free."""
        if self.regex is not None:
            return "regex:" + self.regex
        if self.json_schema is not None:
            return "json:" + self.json_schema
        return None

    @property
    def uses_penalties(self) -> bool:
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _token_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX
