"""SGLang's `/generate` request: whether a body is in SGLang's form, and what it asks for.

A body is in SGLang's form when it uses anything that only SGLang's protocol has: a
`sampling_params` name that Sluice's `SamplingParams` lacks (`max_new_tokens`,
`min_new_tokens`, `n`, `spaces_between_special_tokens`, `stop_regex`, `json_schema`,
...), a top-level field that Sluice's own `/generate` lacks (`return_text_in_logprobs`,
`top_logprobs_num`, `lora_path`, `model`, ...), or a batch (`text` a list of strings,
`input_ids` a list of lists, `sampling_params` or `rid` a list). Any other body is
Sluice's own form (`runtime.api.http.generate`).

In SGLang's form:
- `sampling_params` take both vocabularies: SGLang's names map onto `SamplingParams`
  (`max_new_tokens` -> `max_tokens`, `sampling_seed` -> `seed`, a null value is the
  default), Sluice's extras stay; naming one thing twice (`max_tokens` and
  `max_new_tokens`) or a name neither has is a 400, as SGLang's schema refuses unknown
  sampling parameters.
- `n` > 1 runs n requests per prompt, in SGLang's order (the whole batch, n times; with a
  seed, sample j gets seed + j) and answers a list.
- `lora_path` names the LoRA adapter (one for all prompts, or a list with one per prompt;
  null or "": the base model); an adapter the server does not have is a 400.
- Fields that SGLang has and Sluice does not implement (images, sessions, hidden
  states, ...) are accepted only while empty (null, false, 0, "", [] or {}); otherwise a
  400 names the field. Hints that change nothing about the output are ignored: `model`
  (which routers add), logging and routing fields, `stream_interval`.
- Top-level names that neither protocol has are a 400 (SGLang ignores them; Sluice keeps
  its check for typos).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from runtime.api.http.sampling_json import params_from_json
from runtime.api.openai.protocol import ApiError
from runtime.wire.sampling import MAX_TOP_LOGPROBS, SamplingParams

# the top-level fields of Sluice's own form (native_api.GenerateRequest)
SLUICE_FIELDS = frozenset({"text", "input_ids", "sampling_params", "stream", "priority",
                           "ignore_eos", "return_logprob", "rid", "logprob_start_len"})
# SGLang's top-level fields that Sluice implements beyond its own form
_SGLANG_FIELDS = frozenset({"top_logprobs_num", "return_text_in_logprobs", "lora_path"})
_IGNORED_FIELDS = frozenset({
    "model", "log_metrics", "no_logs", "custom_labels", "routing_key", "conversation_id",
    "received_time", "external_trace_header", "http_worker_ipc", "routed_dp_rank",
    "data_parallel_rank", "disagg_prefill_dp_rank"})
# SGLang's top-level fields that Sluice does not implement: accepted only while empty
_EMPTY_ONLY_FIELDS = frozenset({
    "audio_data", "background", "bootstrap_host", "bootstrap_pair_key", "bootstrap_port",
    "bootstrap_room", "cache_salt", "custom_logit_processor", "decode_tp_size",
    "encoder_urls", "extra_key", "image_data", "image_max_dynamic_patch", "images_config",
    "input_embeds", "kv_hints", "lora_id", "max_dynamic_patch",
    "max_thinking_tokens", "min_dynamic_patch", "mm_content_hashes", "mm_hashes",
    "mm_processor_kwargs", "modalities", "multi_item_delimiter_indices",
    "need_wait_for_mm_inputs", "num_items_assigned", "positional_embed_overrides",
    "require_reasoning", "return_bytes", "return_entropy",
    "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs",
    "return_hidden_states", "return_indexer_topk", "return_prompt_token_ids",
    "return_routed_experts", "return_sampling_mask", "routed_experts_start_len",
    "sampling_logprobs_mode", "session_id", "session_params", "token_ids_logprob",
    "token_indices_to_pool", "use_audio_in_video", "video_config", "video_data",
    "video_max_dynamic_patch", "watermark"})
_SGLANG_ONLY = _SGLANG_FIELDS | _IGNORED_FIELDS | _EMPTY_ONLY_FIELDS

_PARAM_NAMES = frozenset(SamplingParams.__struct_fields__)
_RENAMED_PARAMS = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}
_IGNORED_PARAMS = frozenset({"n", "stream_interval"})  # n: the number of samples
# SGLang's sampling parameters Sluice does not implement: only their default is accepted
_DEFAULT_ONLY_PARAMS = {
    "min_new_tokens": 0, "spaces_between_special_tokens": True, "stop_regex": None,
    "no_stop_trim": False, "ebnf": None, "structural_tag": None, "custom_params": None,
    "beam_width": None, "watermark": None, "choice": None}
_MAX_SAMPLES = 16  # `n`, as the OpenAI surface allows


@dataclass
class SglItem:
    """One request of an SGLang `/generate` call (a prompt, or one of its n samples)."""

    prompt: str | list[int]
    params: SamplingParams
    rid: str
    return_logprob: bool
    logprob_start_len: int  # SGLang's: -1 no input logprobs, 0 from the first token on
    given: frozenset[str] = frozenset()  # the sampling fields the request set


@dataclass
class SglRequest:
    """An SGLang `/generate` call: its requests, and how to answer it."""

    items: list[SglItem]
    batch: bool  # answer a list (one entry per item), else one object
    stream: bool
    text_in_logprobs: bool  # logprob entries carry each token's text


def is_sglang_form(body: dict[str, Any]) -> bool:
    """Whether a `/generate` body uses anything only SGLang's protocol has."""
    if any(name not in SLUICE_FIELDS for name in body):
        return True
    params = body.get("sampling_params")
    if isinstance(params, list) or isinstance(body.get("rid"), list):
        return True
    if isinstance(params, dict) and any(name not in _PARAM_NAMES for name in params):
        return True
    return _is_batch(body)


def parse_sglang(body: dict[str, Any], lora_names: Collection[str] = ()) -> SglRequest:
    """The requests of an SGLang-form body, whose `lora_path` may name any of
    `lora_names`; `ApiError(400)` naming what is wrong."""
    for name, value in body.items():
        if name in _EMPTY_ONLY_FIELDS and not _is_empty(value):
            raise ApiError(400, f"`{name}` is not supported by this server (only an empty "
                                "value is accepted)", param=name)
        if name not in SLUICE_FIELDS and name not in _SGLANG_ONLY:
            raise ApiError(400, f"unknown field `{name}`", param=name)
    prompts = _prompts(body)
    raw = body.get("sampling_params") or {}
    if isinstance(raw, list) and len(raw) != len(prompts):
        raise ApiError(400, f"sampling_params has {len(raw)} entries for {len(prompts)} "
                            "prompts", param="sampling_params")
    raws = raw if isinstance(raw, list) else [raw] * len(prompts)
    if not all(isinstance(r, dict) for r in raws):
        raise ApiError(400, "sampling_params must be an object or a list of objects",
                       param="sampling_params")
    n = _samples(raws)
    per_prompt = {name: _per_prompt(body, name, default, len(prompts), n)
                  for name, default in (("return_logprob", False), ("logprob_start_len", -1),
                                        ("top_logprobs_num", 0), ("lora_path", None))}
    rids = _rids(body.get("rid"), len(prompts), n)
    items = []
    for k in range(len(prompts) * n):
        p, sample = k % len(prompts), k // len(prompts)
        want, start = per_prompt["return_logprob"][p], per_prompt["logprob_start_len"][p]
        if not isinstance(want, bool):
            raise ApiError(400, "return_logprob must be a boolean", param="return_logprob")
        if not isinstance(start, int) or isinstance(start, bool):
            raise ApiError(400, "logprob_start_len must be an int", param="logprob_start_len")
        top = per_prompt["top_logprobs_num"][p] or 0
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"top_logprobs_num must be an int in [0, {MAX_TOP_LOGPROBS}]",
                           param="top_logprobs_num")
        params = to_params(raws[p], body)
        params.top_logprobs = top if want else 0
        if params.seed is not None:
            params.seed += sample
        params.logprobs = want
        params.logprob_start_len = start if want and start >= 0 else -1
        params.lora = _lora(per_prompt["lora_path"][p], lora_names)
        given = frozenset(_RENAMED_PARAMS.get(name, name) for name, value in raws[p].items()
                          if value is not None)
        items.append(SglItem(prompts[p], params, rids[k], want, start, given))
    return SglRequest(items, batch=len(items) > 1 or _is_batch(body),
                      stream=bool(body.get("stream", False)),
                      text_in_logprobs=bool(body.get("return_text_in_logprobs")))


def to_params(raw: dict[str, Any], body: dict[str, Any]) -> SamplingParams:
    """SamplingParams from SGLang-form sampling params (and the top-level `priority`,
    `ignore_eos`)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _DEFAULT_ONLY_PARAMS:
            default = _DEFAULT_ONLY_PARAMS[name]
            if not (value is None or value == default or (default is None and _is_empty(value))):
                raise ApiError(400, f"sampling_params.{name}={value!r} is not supported by "
                                    "this server", param=f"sampling_params.{name}")
            continue
        if name in _IGNORED_PARAMS:
            continue
        target = _RENAMED_PARAMS.get(name, name)
        if target not in _PARAM_NAMES:
            known = sorted(_PARAM_NAMES | set(_RENAMED_PARAMS) | set(_DEFAULT_ONLY_PARAMS)
                           | _IGNORED_PARAMS)
            raise ApiError(400, f"unknown sampling_params [{name!r}]; known: {known}",
                           param="sampling_params")
        if target in out:
            raise ApiError(400, f"sampling_params names {target!r} twice (as {name!r} too)",
                           param=f"sampling_params.{name}")
        if value is None:
            if name == "max_new_tokens":
                raise ApiError(400, "sampling_params.max_new_tokens must be an int",
                               param="sampling_params.max_new_tokens")
            continue
        out[target] = [value] if target == "stop" and isinstance(value, str) else value
    for name in ("priority", "ignore_eos"):
        if body.get(name) is not None:
            out[name] = body[name]
    return params_from_json(out)


# ---------------------------------------------------------------- helpers
def _lora(path: Any, lora_names: Collection[str]) -> str | None:
    """The adapter `lora_path` names (None or "": the base model)."""
    if path is None or path == "":
        return None
    if not isinstance(path, str) or path not in lora_names:
        raise ApiError(400, f"lora_path: unknown LoRA adapter {path!r}; this server has "
                            f"{list(lora_names)}", param="lora_path")
    return path


def _is_batch(body: dict[str, Any]) -> bool:
    text, ids = body.get("text"), body.get("input_ids")
    return isinstance(text, list) or (isinstance(ids, list) and bool(ids)
                                      and isinstance(ids[0], list))


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError(400, "give exactly one of `text` and `input_ids`")
    if isinstance(text, str):
        return [text]
    if text is not None:
        if not text or not all(isinstance(t, str) for t in text):
            raise ApiError(400, "text must be a string or a non-empty list of strings",
                           param="text")
        return list(text)
    if not isinstance(ids, list) or not ids:
        raise ApiError(400, "input_ids must be a non-empty list of token ids or of lists of "
                            "them", param="input_ids")
    if isinstance(ids[0], list):
        if not all(isinstance(p, list) for p in ids):
            raise ApiError(400, "input_ids mixes token ids and lists", param="input_ids")
        return list(ids)
    return [ids]


def _samples(raws: list[dict[str, Any]]) -> int:
    ns = {1 if r.get("n") is None else r["n"] for r in raws}
    if len(ns) > 1:
        raise ApiError(400, "every prompt must have the same sampling_params.n",
                       param="sampling_params.n")
    n = ns.pop()
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= _MAX_SAMPLES):
        raise ApiError(400, f"sampling_params.n must be an int in [1, {_MAX_SAMPLES}]",
                       param="sampling_params.n")
    return n


def _per_prompt(body: dict[str, Any], name: str, default: Any, num: int, n: int) -> list:
    value = body.get(name)
    if value is None:
        return [default] * num
    if not isinstance(value, list):
        return [value] * num
    if len(value) != num or n > 1:
        raise ApiError(400, f"a list {name} needs one entry per prompt and n = 1", param=name)
    return [default if v is None else v for v in value]


def _rids(rid: Any, num: int, n: int) -> list[str]:
    """One id per item: SGLang's `<rid>_<k>` for a batch given one rid."""
    total = num * n
    if rid is None:
        return [uuid.uuid4().hex for _ in range(total)]
    if isinstance(rid, str):
        return [rid] if total == 1 else [f"{rid}_{k}" for k in range(total)]
    if not (isinstance(rid, list) and len(rid) == num and all(isinstance(r, str) for r in rid)):
        raise ApiError(400, "rid must be a string or a list of one string per prompt",
                       param="rid")
    return rid * n if n == 1 else [f"{rid[k % num]}_{k // num}" for k in range(total)]


def _is_empty(value: Any) -> bool:
    """null, false, 0, "", [] or {}, or a list of those (a batch's per-prompt nulls)."""
    if isinstance(value, list):
        return all(_is_empty(v) for v in value)
    return value is None or value is False or value == 0 or value in ("", {})
