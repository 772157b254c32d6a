"""Check a request against the model and the scheduler's limits, and tokenize its prompt
(`check_request` before the tokenization, `check_prompt_ids` after)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from runtime.api.prompt_tokenizer import PromptTokenizer
from runtime.grammar import check_grammar
from runtime.wire.api_input import Limits
from runtime.wire.errors import ContextLengthExceeded, InvalidRequest
from runtime.wire.sampling import SamplingParams


async def prepare_prompt(prompt: Any, params: SamplingParams,
                         tokenizer: PromptTokenizer | None, model: str, vocab_size: int,
                         limits: Limits, fit_max_tokens: bool = False) -> list[int]:
    """The prompt's token ids (text tokenized off the event loop when long), or
    `InvalidRequest` naming what is wrong (see `check_request`, `check_prompt_ids`, and
    `SamplingParams.check_vocab`). `fit_max_tokens`: max_tokens is a default, not the
    request's: shorten it to what the context leaves after the prompt."""
    check_request(prompt, params, tokenizer, model)
    params.check_vocab(vocab_size)
    ids = prompt
    if isinstance(prompt, str):
        ids = await tokenizer.encode(prompt, limits.max_req_input_len) if prompt else []
    if fit_max_tokens and isinstance(ids, list):
        params.max_tokens = max(1, min(params.max_tokens, limits.max_context - len(ids)))
    return check_prompt_ids(ids, vocab_size, limits, params.max_tokens)


def check_request(prompt: Any, params: SamplingParams, tokenizer: Any, model: str) -> None:
    """Raise `InvalidRequest` naming what is wrong: the params, the prompt's type, or a
    feature the model lacks a tokenizer for."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequest(f"params must be SamplingParams, got {type(params).__name__}")
    params.validate()
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidRequest(f"model {model!r} has no tokenizer: "
                                 "send the prompt as token ids (or serve it with --tokenizer)")
    elif not isinstance(prompt, list):
        raise InvalidRequest("prompt must be a string or a list of token ids, "
                             f"got {type(prompt).__name__}")
    if params.stop and tokenizer is None:
        raise InvalidRequest(f"model {model!r} has no tokenizer: "
                             "stop strings are unsupported (use stop_token_ids)")
    if params.grammar is not None:
        if tokenizer is None:
            raise InvalidRequest(f"model {model!r} has no tokenizer: "
                                 "regex and json_schema constraints are unsupported")
        check_grammar(params)


def check_lora(params: SamplingParams, lora_names: Collection[str]) -> None:
    """Raise `InvalidRequest` unless `params.lora` is None or one of `lora_names`."""
    if params.lora is not None and params.lora not in lora_names:
        raise InvalidRequest(f"lora: unknown LoRA adapter {params.lora!r}; this server "
                             f"has {list(lora_names)}")


def check_prompt_ids(ids: list[Any], vocab_size: int, limits: Limits,
                     max_tokens: int) -> list[int]:
    """The prompt's token ids, or `InvalidRequest` for an empty prompt, a length past
    `limits` (the longest prompt, and prompt + max_tokens within the context), or an id
    that is not an int of the vocabulary. The length is checked first, so an over-long
    list is rejected without a look at its ids."""
    if not ids:
        raise InvalidRequest("prompt is empty")
    n = len(ids)
    limit = limits.max_context
    if n > limits.max_req_input_len:
        raise ContextLengthExceeded(f"prompt is {n} tokens; this model takes at most "
                             f"{limits.max_req_input_len} prompt tokens "
                             f"(context length {limit})")
    if not (all(type(t) is int for t in ids) and min(ids) >= 0 and max(ids) < vocab_size):
        _check_ids_one_by_one(ids, vocab_size)
    if n + max_tokens > limit:
        raise ContextLengthExceeded(f"prompt ({n} tokens) + max_tokens ({max_tokens}) = "
                             f"{n + max_tokens} exceeds the context length of "
                             f"{limit} tokens; set max_tokens <= {limit - n}")
    return list(ids)


def _check_ids_one_by_one(ids: list[Any], vocab_size: int) -> None:
    """Name the first bad id (the fast check above only tells that there is one)."""
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool):
            raise InvalidRequest(f"prompt token ids must be ints, got {t!r}")
        if not 0 <= t < vocab_size:
            raise InvalidRequest(f"prompt token id {t} is outside the vocabulary "
                                 f"[0, {vocab_size})")
