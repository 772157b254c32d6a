"""`logit_bias` and `allowed_token_ids` reach the scheduler from every surface (OpenAI
completions and chat through the `openai` client, `/generate` in Sluice's and SGLang's
forms, RPC, the DSL over HTTP and RPC), and bad values are refused before it, naming the
field. The api runs in this process over a fake scheduler."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest

import frontend as sl
from runtime.client import Client
from runtime.config.server import ServerConfig
from runtime.wire.errors import InvalidRequest
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.front_helpers import fronts

VOCAB = 49152  # SmolLM2's
BIAS = {42: -100.0, 7: 5.5}
ALLOWED = [7, 42, 100]


@pytest.fixture(scope="module")
def served(spec, script_ids):
    cfg = ServerConfig(port=0, rpc_port=0, log_level="warning")
    with FakeScheduler(cfg, lambda r: script_ids) as fake, fronts(cfg, spec) as f:
        yield f, fake
    shutil.rmtree(cfg.ipc_dir, ignore_errors=True)


def last_params(fake: FakeScheduler):
    return fake.of_type(GenerateReq)[-1].params


@sl.function
def biased(s):
    s += "Hi"
    s += sl.gen("out", max_tokens=2, logit_bias=BIAS, allowed_token_ids=ALLOWED)


def test_every_surface_carries_both_fields(served):
    f, fake = served
    json_bias = {str(k): v for k, v in BIAS.items()}
    with openai.OpenAI(base_url=f"{f.url}/v1", api_key="none", max_retries=0) as oai:
        oai.completions.create(model="smollm2", prompt="Hi", max_tokens=2, logit_bias=json_bias,
                               extra_body={"allowed_token_ids": ALLOWED})
        assert (last_params(fake).logit_bias, last_params(fake).allowed_token_ids) == (
            BIAS, ALLOWED)
        oai.chat.completions.create(model="smollm2", max_tokens=2, logit_bias=json_bias,
                                    messages=[{"role": "user", "content": "Hi"}])
        assert last_params(fake).logit_bias == BIAS
        assert last_params(fake).allowed_token_ids is None
    with httpx.Client(base_url=f.url, timeout=30) as http:
        for sampling in ({"max_tokens": 2}, {"max_new_tokens": 2}):  # Sluice's, SGLang's form
            r = http.post("/generate", json={"text": "Hi", "sampling_params": {
                **sampling, "logit_bias": json_bias, "allowed_token_ids": ALLOWED}})
            assert r.status_code == 200, r.text
            assert (last_params(fake).logit_bias, last_params(fake).allowed_token_ids) == (
                BIAS, ALLOWED)
    with Client(f.rpc_addr, timeout=30) as client:
        client.generate("Hi", max_tokens=2, logit_bias=BIAS, allowed_token_ids=ALLOWED)
        assert (last_params(fake).logit_bias, last_params(fake).allowed_token_ids) == (
            BIAS, ALLOWED)
    for url in (f.url, f.rpc_addr):
        before = len(fake.of_type(GenerateReq))
        endpoint = sl.RuntimeEndpoint(url)
        try:
            biased.run(backend=endpoint)
        finally:
            endpoint.close()
        assert len(fake.of_type(GenerateReq)) == before + 1
        assert (last_params(fake).logit_bias, last_params(fake).allowed_token_ids) == (
            BIAS, ALLOWED)


BAD = [
    ({"logit_bias": {"5": 100.5}}, "logit_bias values must be in [-100, 100]"),
    ({"logit_bias": {"5": -101}}, "logit_bias values must be in [-100, 100]"),
    ({"logit_bias": {str(VOCAB): 1}}, f"logit_bias token id {VOCAB} is outside the vocabulary"),
    ({"logit_bias": {"-1": 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {str(1 << 64): 1}}, "logit_bias"),
    ({"logit_bias": {"5": "high"}}, "logit_bias"),
    ({"logit_bias": [5]}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids must be a non-empty list"),
    ({"allowed_token_ids": [3, VOCAB]}, f"allowed_token_ids token id {VOCAB} is outside"),
    ({"allowed_token_ids": [-3]}, "allowed_token_ids must be token ids"),
    ({"allowed_token_ids": [3], "regex": "a+"}, "allowed_token_ids cannot be combined"),
]


@pytest.mark.parametrize("fields, needle", BAD)
def test_bad_values_are_a_400_naming_the_field_on_every_route(served, fields, needle):
    f, fake = served
    before = len(fake.of_type(GenerateReq))
    openai_fields = dict(fields)
    if "regex" in openai_fields:  # the OpenAI routes constrain through response_format
        openai_fields.pop("regex")
        openai_fields["response_format"] = {"type": "json_object"}
        needle = "allowed_token_ids cannot be combined"
    bodies = [
        ("/v1/completions", {"model": "smollm2", "prompt": "Hi", **openai_fields}),
        ("/v1/chat/completions", {"model": "smollm2", **openai_fields,
                                  "messages": [{"role": "user", "content": "Hi"}]}),
        ("/generate", {"text": "Hi", "sampling_params": fields}),
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, **fields}}),
    ]
    with httpx.Client(base_url=f.url, timeout=30) as http:
        for path, body in bodies:
            r = http.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            assert needle in r.json()["error"]["message"], (path, r.text)
    assert len(fake.of_type(GenerateReq)) == before  # nothing reached the scheduler


@pytest.mark.parametrize("fields, needle", [
    ({"logit_bias": {5: 100.5}}, "logit_bias values must be in [-100, 100]"),
    ({"logit_bias": {VOCAB + 3: -1.0}}, f"logit_bias token id {VOCAB + 3} is outside"),
    ({"allowed_token_ids": []}, "allowed_token_ids must be a non-empty list"),
    ({"allowed_token_ids": [1 << 40]}, "allowed_token_ids token id 1099511627776 is outside"),
])
def test_rpc_client_raises_invalid_request(served, fields, needle):
    f, fake = served
    with Client(f.rpc_addr, timeout=30) as client, pytest.raises(InvalidRequest) as err:
        client.generate("Hi", max_tokens=2, **fields)
    assert needle in str(err.value)
