"""Check a request against the model and the scheduler's limits, and tokenize its prompt."""

from __future__ import annotations

from typing import Any

from runtime.grammar import check_regex
from runtime.messages import InvalidRequest, Limits, SamplingParams


class ContextLengthExceeded(InvalidRequest):
    """The prompt, or the prompt plus max_tokens, does not fit the context."""

    code = "context_length_exceeded"  # the OpenAI error code


def prepare_prompt(prompt: str | list[int], params: SamplingParams, tokenizer: Any,
                   model: str, vocab_size: int, limits: Limits) -> list[int]:
    """The prompt's token ids, or `InvalidRequest` naming what is wrong: the params, the
    prompt's type or ids, a feature the model lacks a tokenizer for, or a length past
    `limits` (the longest prompt, and prompt + max_tokens within the context)."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequest(f"params must be SamplingParams, got {type(params).__name__}")
    params.validate()
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidRequest(f"model {model!r} has no tokenizer: "
                                 "send the prompt as token ids")
        ids = tokenizer.encode(prompt) if prompt else []
    elif isinstance(prompt, list):
        ids = prompt
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise InvalidRequest(f"prompt token ids must be ints, got {t!r}")
            if not 0 <= t < vocab_size:
                raise InvalidRequest(f"prompt token id {t} is outside the vocabulary "
                                     f"[0, {vocab_size})")
    else:
        raise InvalidRequest("prompt must be a string or a list of token ids, "
                             f"got {type(prompt).__name__}")
    if not ids:
        raise InvalidRequest("prompt is empty")
    if params.stop and tokenizer is None:
        raise InvalidRequest(f"model {model!r} has no tokenizer: "
                             "stop strings are unsupported (use stop_token_ids)")
    if params.regex is not None:
        if tokenizer is None:
            raise InvalidRequest(f"model {model!r} has no tokenizer: "
                                 "regex constraints are unsupported")
        check_regex(params.regex)
    n = len(ids)
    limit = limits.max_context
    if n > limits.max_req_input_len:
        raise ContextLengthExceeded(f"prompt is {n} tokens; this model takes at most "
                             f"{limits.max_req_input_len} prompt tokens "
                             f"(context length {limit})")
    if n + params.max_tokens > limit:
        raise ContextLengthExceeded(f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) = "
                             f"{n + params.max_tokens} exceeds the context length of "
                             f"{limit} tokens; set max_tokens <= {limit - n}")
    return list(ids)
