"""Picking a LoRA adapter on every surface (OpenAI `model`, SGLang `lora_path`, native,
RPC and Engine `lora`), `/v1/models` listing the adapters, and an unknown adapter as a
400 naming the field. The api runs in this process over a fake scheduler."""

from __future__ import annotations

import httpx
import pytest

from runtime.client import Client
from runtime.wire.errors import InvalidRequest
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.http.test_health import http_front
from tests.api.rpc.test_server import serving
from tests.attack.http_inputs import lora_bodies


@pytest.fixture
def lora_cfg(cfg):
    return cfg.replace(lora_paths=("sql=/adapters/sql", "chat-v2=/adapters/chat"))


GOOD = [  # (path, body, the adapter the scheduler gets)
    ("/v1/completions", {"model": "smollm2", "prompt": "Hi", "max_tokens": 2}, None),
    ("/v1/completions", {"model": "sql", "prompt": "Hi", "max_tokens": 2}, "sql"),
    ("/v1/chat/completions", {"model": "smollm2:chat-v2", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "Hi"}]}, "chat-v2"),
    ("/generate", {"text": "Hi", "lora_path": "sql", "sampling_params": {"max_new_tokens": 2}},
     "sql"),
    ("/generate", {"text": "Hi", "lora_path": None, "sampling_params": {"max_new_tokens": 2}},
     None),
    ("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 2, "lora": "chat-v2"}},
     "chat-v2"),
]
BAD = [  # (path, body, status, the field named, words of the message)
    ("/v1/completions", {"model": "smollm2:nope", "prompt": "Hi"}, 400, "model",
     "unknown LoRA adapter 'nope'"),
    ("/v1/chat/completions", {"model": "smollm2:", "messages": [{"role": "user",
                                                                  "content": "Hi"}]},
     400, "model", "unknown LoRA adapter ''"),
    ("/v1/completions", {"model": "nope", "prompt": "Hi"}, 404, "model", "does not exist"),
    ("/generate", {"text": "Hi", "lora_path": "nope"}, 400, "lora_path",
     "lora_path: unknown LoRA adapter 'nope'"),
    ("/generate", {"text": ["Hi", "Yo"], "lora_path": ["sql", 7]}, 400, "lora_path",
     "unknown LoRA adapter 7"),
    ("/generate", {"text": "Hi", "sampling_params": {"lora": "nope"}}, 400, None,
     "lora: unknown LoRA adapter 'nope'"),
    ("/generate", {"text": "Hi", "sampling_params": {"lora": ""}}, 400, None,
     "lora must be an adapter name"),
]


def test_adapters_are_picked_and_listed_over_http(lora_cfg, spec, script_ids):
    with (
        FakeScheduler(lora_cfg, lambda r: script_ids[:2]) as fake,
        http_front(lora_cfg, spec) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        for path, body, _ in GOOD:
            r = http.post(path, json=body)
            assert r.status_code == 200, (path, body, r.text)
        for path, body, status, param, words in BAD:
            r = http.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            error = r.json()["error"]
            assert error["param"] == param and words in error["message"], (body, error)
        cards = http.get("/v1/models").json()["data"]
        card = http.get("/v1/models/smollm2:sql").json()
    assert [r.params.lora for r in fake.of_type(GenerateReq)] == [a for _, _, a in GOOD]
    assert [(c["id"], c.get("parent")) for c in cards] == [
        ("smollm2", None), ("sql", "smollm2"), ("chat-v2", "smollm2")]
    assert card["id"] == "sql" and card["parent"] == "smollm2"


def test_adapters_are_picked_over_rpc(lora_cfg, spec, script_ids):
    with FakeScheduler(lora_cfg, lambda r: script_ids[:2]) as fake, \
            serving(lora_cfg, spec) as (_, rpc, _lt), Client(rpc.addr, timeout=5) as client:
        with pytest.raises(InvalidRequest, match="lora: unknown LoRA adapter 'nope'"):
            client.generate("Hi", max_tokens=2, lora="nope")
        assert client.generate("Hi", max_tokens=2, lora="sql").finish_reason == "length"
    assert [r.params.lora for r in fake.of_type(GenerateReq)] == ["sql"]


def test_a_server_without_adapters_refuses_any(cfg, spec, script_ids):
    with (
        FakeScheduler(cfg, lambda r: script_ids[:2]) as fake,
        http_front(cfg, spec) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        r = http.post("/v1/completions", json={"model": "smollm2:sql", "prompt": "Hi"})
        assert r.status_code == 400 and "[]" in r.json()["error"]["message"]
        assert http.get("/v1/models").json()["data"][0].get("parent") is None
        r = http.post("/generate", json={"text": "Hi", "lora_path": "sql"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
    assert not fake.of_type(GenerateReq)


def test_the_attack_batterys_lora_inputs_get_answers_under_500(lora_cfg, spec, script_ids):
    with (
        FakeScheduler(lora_cfg, lambda r: script_ids[:2]),
        http_front(lora_cfg, spec) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        for path, body in lora_bodies("smollm2"):
            r = http.post(path, json=body)
            assert r.status_code in (200, 400, 404), (path, body, r.text)
