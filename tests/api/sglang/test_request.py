"""Which `/generate` bodies are in SGLang's form, and what they ask for (no server)."""

from __future__ import annotations

import pytest

from runtime.api.http.generate import GenerateRequest
from runtime.api.openai.protocol import ApiError
from runtime.api.sglang.request import SLUICE_FIELDS, is_sglang_form, parse_sglang


def test_sluice_fields_are_the_native_request_fields():
    assert frozenset(GenerateRequest.__struct_fields__) == SLUICE_FIELDS


@pytest.mark.parametrize("body,sglang", [
    ({"text": "Hi"}, False),
    ({"text": "Hi", "sampling_params": {"max_tokens": 3, "regex": "a+"}, "stream": True}, False),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 0}, False),
    ({"text": "Hi", "sampling_params": {"max_new_tokens": 3}}, True),
    ({"text": "Hi", "sampling_params": {"n": 1}}, True),
    ({"text": "Hi", "return_text_in_logprobs": True}, True),
    ({"text": "Hi", "model": "smollm2"}, True),
    ({"text": "Hi", "lora_path": None}, True),
    ({"text": ["a", "b"]}, True),
    ({"input_ids": [[1], [2]]}, True),
    ({"text": "Hi", "rid": ["a"]}, True),
    ({"text": "Hi", "sampling_params": [{}]}, True),
])
def test_form_follows_the_names_and_shapes_used(body, sglang):
    assert is_sglang_form(body) == sglang


def test_sglang_names_map_onto_sampling_params():
    req = parse_sglang({"text": "Hi", "stream": True, "return_logprob": True,
                        "logprob_start_len": 2, "model": "whatever", "lora_path": None,
                        "image_data": [], "return_text_in_logprobs": True,
                        "sampling_params": {
                            "max_new_tokens": 7, "min_new_tokens": 0, "n": 1, "stop": "\n",
                            "stop_token_ids": [5], "stop_regex": [], "temperature": 0,
                            "top_k": 1 << 30, "sampling_seed": 3, "json_schema": None,
                            "spaces_between_special_tokens": True, "regex": None,
                            "ignore_eos": False, "stream_interval": 4}})
    [item] = req.items
    p = item.params
    assert (p.max_tokens, p.stop, p.stop_token_ids, p.temperature, p.seed) == (
        7, ["\n"], [5], 0, 3)
    assert p.logprobs and p.logprob_start_len == 2 and item.return_logprob
    assert req.stream and req.text_in_logprobs and not req.batch


def test_n_and_batches_expand_in_sglang_order():
    req = parse_sglang({"text": ["a", "b"], "rid": "r",
                        "sampling_params": {"n": 2, "sampling_seed": 10, "max_new_tokens": 1}})
    assert [i.prompt for i in req.items] == ["a", "b", "a", "b"]
    assert [i.rid for i in req.items] == ["r_0", "r_1", "r_2", "r_3"]
    assert [i.params.seed for i in req.items] == [10, 10, 11, 11]
    assert req.batch
    one = parse_sglang({"input_ids": [1, 2], "sampling_params": {"n": 2}})
    assert one.batch and [i.prompt for i in one.items] == [[1, 2], [1, 2]]
    per = parse_sglang({"input_ids": [[1], [2]], "rid": ["x", "y"], "return_logprob": [True, False],
                        "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]})
    assert [(i.rid, i.params.max_tokens, i.return_logprob) for i in per.items] == [
        ("x", 1, True), ("y", 2, False)]


@pytest.mark.parametrize("body,needle", [
    ({"text": "Hi", "lora_path": "adapter-1"}, "lora_path"),
    ({"text": "Hi", "image_data": ["x.png"]}, "image_data"),
    ({"text": "Hi", "session_params": {"id": "s"}}, "session_params"),
    ({"text": "Hi", "model": "m", "colour": 1}, "colour"),
    ({"text": "Hi", "sampling_params": {"max_new_tokens": 1, "max_tokens": 1}}, "twice"),
    ({"text": "Hi", "sampling_params": {"max_new_tokens": 1, "bogus": 1}}, "bogus"),
    ({"text": "Hi", "sampling_params": {"max_new_tokens": None}}, "max_new_tokens"),
    ({"text": "Hi", "sampling_params": {"min_new_tokens": 2}}, "min_new_tokens"),
    ({"text": "Hi", "sampling_params": {"stop_regex": "a+"}}, "stop_regex"),
    ({"text": "Hi", "sampling_params": {"spaces_between_special_tokens": False}},
     "spaces_between_special_tokens"),
    ({"text": "Hi", "model": "m", "return_logprob": True, "top_logprobs_num": 21},
     "top_logprobs_num"),
    ({"text": "Hi", "model": "m", "top_logprobs_num": "2"}, "top_logprobs_num"),
    ({"text": "Hi", "sampling_params": {"n": 0}}, "n must be"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "2 prompts"),
    ({"text": ["a", "b"], "rid": ["x"]}, "rid"),
    ({"text": "Hi", "input_ids": [1], "model": "m"}, "exactly one"),
    ({"text": "Hi", "model": "m", "logprob_start_len": "0"}, "logprob_start_len"),
    ({"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": "hot"}},
     "temperature"),
])
def test_what_sglang_form_refuses_names_the_field(body, needle):
    with pytest.raises(ApiError) as err:
        parse_sglang(body)
    assert err.value.status == 400 and needle in err.value.message


def test_top_logprobs_num_and_json_schema_map_onto_sampling_params():
    schema = '{"type": "object"}'
    req = parse_sglang({"text": "Hi", "return_logprob": True, "top_logprobs_num": 3,
                        "sampling_params": {"max_new_tokens": 4, "json_schema": schema}})
    params = req.items[0].params
    assert params.top_logprobs == 3 and params.logprobs and params.json_schema == schema
    # SGLang returns alternatives only with return_logprob
    plain = parse_sglang({"text": "Hi", "top_logprobs_num": 3,
                          "sampling_params": {"max_new_tokens": 4}})
    assert plain.items[0].params.top_logprobs == 0
