"""A model's generation_config.json as default sampling parameters: every API (OpenAI,
SGLang and Sluice `/generate`, RPC) fills the fields a request leaves unset from it, a
field the request sets wins, and `/get_model_info` states the defaults."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import msgspec
import pytest

from runtime.api.sampling_defaults import InvalidGenerationConfig, SamplingDefaults
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.client import Client
from runtime.config.server import ServerConfig
from runtime.wire.api_input import Limits
from runtime.wire.errors import ContextLengthExceeded
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.front_helpers import fronts

BOUND_S = 30.0  # a bound on waiting for the server, never a timing assertion
GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
              "repetition_penalty": 1.1, "max_new_tokens": 7, "bos_token_id": 1}
DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1,
            "max_tokens": 7}


def generation_folder(tmp_path_factory, values: dict) -> str:
    folder = tmp_path_factory.mktemp("generation")
    (folder / "generation_config.json").write_text(json.dumps(values))
    return str(folder)


@pytest.fixture(scope="module")
def served(tmp_path_factory, spec, script_ids):
    cfg = ServerConfig(port=0, rpc_port=0, log_level="warning",
                       generation_config=generation_folder(tmp_path_factory, GENERATION))
    with (
        FakeScheduler(cfg, lambda r: script_ids) as fake,
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=BOUND_S) as http,
    ):
        yield http, fake, f
    shutil.rmtree(cfg.ipc_dir, ignore_errors=True)


def sent_params(fake: FakeScheduler, before: int) -> SamplingParams:
    """The params of the one request that reached the scheduler since `before`."""
    [req] = fake.of_type(GenerateReq)[before:]
    return req.params


def sampling(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in DEFAULTS}


REQUESTS = {  # (path, body) of a request through each HTTP surface, sampling fields to add
    "completions": ("/v1/completions", {"model": "smollm2", "prompt": "Hi"}, None),
    "chat": ("/v1/chat/completions",
             {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}, None),
    "sluice": ("/generate", {"text": "Hi"}, "sampling_params"),
    "sglang": ("/generate", {"text": "Hi", "return_logprob": False}, "sampling_params"),
}


def post(http, fake, surface: str, **fields) -> SamplingParams:
    path, body, nest = REQUESTS[surface]
    before = len(fake.of_type(GenerateReq))
    body = {**body, nest: fields} if nest else {**body, **fields}
    if surface == "sglang" and "max_tokens" in fields:
        body["sampling_params"]["max_new_tokens"] = body["sampling_params"].pop("max_tokens")
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return sent_params(fake, before)


@pytest.mark.parametrize("surface", sorted(REQUESTS))
def test_a_request_without_sampling_fields_gets_the_files_defaults(served, surface):
    http, fake, _ = served
    assert sampling(post(http, fake, surface)) == DEFAULTS


@pytest.mark.parametrize("surface", sorted(REQUESTS))
def test_fields_the_request_sets_win_over_the_defaults(served, surface):
    http, fake, _ = served
    greedy = post(http, fake, surface, temperature=0, max_tokens=3)
    assert sampling(greedy) == {**DEFAULTS, "temperature": 0.0, "max_tokens": 3}
    # the built-in value, set explicitly, is the request's too
    plain = post(http, fake, surface, temperature=1.0, top_p=1.0)
    assert sampling(plain) == {**DEFAULTS, "temperature": 1.0, "top_p": 1.0}


def test_rpc_requests_get_the_defaults_for_fields_left_at_their_own_default(served):
    _, fake, f = served
    with Client(f.rpc_addr, timeout=BOUND_S) as client:
        before = len(fake.of_type(GenerateReq))
        client.generate("Hi")
        assert sampling(sent_params(fake, before)) == DEFAULTS
        before = len(fake.of_type(GenerateReq))
        client.generate("Hi", temperature=0, max_tokens=2)
        assert sampling(sent_params(fake, before)) == {**DEFAULTS, "temperature": 0.0,
                                                        "max_tokens": 2}
        assert client.model_info().default_sampling_params == DEFAULTS


def test_model_info_states_the_defaults(served):
    http, _, _ = served
    for path in ("/get_model_info", "/model_info"):
        assert http.get(path).json()["default_sampling_params"] == DEFAULTS


def test_a_default_max_tokens_is_shortened_to_what_the_context_leaves(tmp_path_factory, spec):
    cfg = ServerConfig(port=0, rpc_port=0, log_level="warning",
                       generation_config=generation_folder(tmp_path_factory,
                                                           {"max_new_tokens": 1000}))
    limits = Limits(max_context=64, max_req_input_len=63, max_running=4, kv_slots=256,
                    model_max_context=spec.max_context)

    async def body():
        tm = TokenizerManager(cfg, spec)
        await tm.start()
        try:
            for prompt, params in (([5] * 10, SamplingParams()),
                                   ([5] * 10, SamplingParams(max_tokens=54))):
                async for _ in tm.generate(prompt, params):
                    pass
            with pytest.raises(ContextLengthExceeded, match="exceeds the context length"):
                async for _ in tm.generate([5] * 10, SamplingParams(max_tokens=55)):
                    pass
        finally:
            await tm.close()

    with FakeScheduler(cfg, lambda r: [7] * 100, limits=limits) as fake:
        asyncio.run(asyncio.wait_for(body(), BOUND_S))
    assert [r.params.max_tokens for r in fake.of_type(GenerateReq)] == [54, 54]
    shutil.rmtree(cfg.ipc_dir, ignore_errors=True)


def test_none_ignores_the_file_and_bad_values_are_refused(tmp_path_factory, spec):
    assert SamplingDefaults.load("none", spec.path).values == {}
    # the bundled SmolLM2's file carries no sampling fields
    assert SamplingDefaults.load("auto", spec.path).values == {}
    folder = generation_folder(tmp_path_factory, GENERATION)
    assert SamplingDefaults.load(folder, None).values == DEFAULTS
    bad = generation_folder(tmp_path_factory, {"top_p": 0.0})
    with pytest.raises(InvalidGenerationConfig, match="generation_config.json: top_p"):
        SamplingDefaults.load(bad, None)


def test_apply_without_given_treats_built_in_values_as_unset():
    defaults = SamplingDefaults({"temperature": 0.6, "max_tokens": 7})
    params = SamplingParams(temperature=0.0)
    assert defaults.apply(params, None) == {"max_tokens"}
    assert (params.temperature, params.max_tokens) == (0.0, 7)
    params = msgspec.structs.replace(SamplingParams(), top_k=5)
    assert defaults.apply(params, {"temperature"}) == {"max_tokens"}
    assert (params.temperature, params.top_k, params.max_tokens) == (1.0, 5, 7)
