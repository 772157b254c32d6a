"""SGLang's native HTTP API on the api process (fake scheduler, real sockets): both forms
of `/generate`, cumulative streams, batches, and the info and control endpoints."""

from __future__ import annotations

import shutil
import threading

import httpx
import pytest

from runtime.config.server import ServerConfig
from runtime.wire.scheduler_input import AbortReq, FlushCache, GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.front_helpers import fronts
from tests.api.http_helpers import sse_json, wait_until

BOUND_S = 30.0  # a bound on waiting for the server, never a timing assertion
JSON = {"Content-Type": "application/json"}  # what SGLang's clients send on every POST


@pytest.fixture(scope="module")
def served(spec, script_ids):
    """One api process front over a fake scheduler that answers with `script_ids`."""
    cfg = ServerConfig(port=0, rpc_port=0, log_level="warning")
    with (
        FakeScheduler(cfg, lambda r: script_ids, per_msg=2) as fake,
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=BOUND_S) as http,
    ):
        yield http, fake
    shutil.rmtree(cfg.ipc_dir, ignore_errors=True)


def test_sglang_form_answers_text_output_ids_and_meta_info(served, tok, script_ids):
    http, _ = served
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {
        "max_new_tokens": 5, "temperature": 0}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    assert body["output_ids"] == script_ids[:5]
    assert body["text"] == tok.decode(script_ids[:5])
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(tok.encode("Hi")), 5)
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] >= 0 and meta["id"]


def test_sluice_form_keeps_its_own_reply(served, script_ids):
    http, _ = served
    body = http.post("/generate", json={"text": "Hi", "sampling_params": {
        "max_tokens": 4}}).json()
    assert body["finish_reason"] == "length" and body["output_ids"] == script_ids[:4]
    assert body["usage"]["completion_tokens"] == 4 and "meta_info" not in body


def test_sglang_stream_is_cumulative_and_ends_with_done(served, script_ids):
    http, fake = served
    req = {"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 7}}
    fake.hold, lines = threading.Event(), []  # the first event alone, then the rest
    try:
        with http.stream("POST", "/generate", json=req) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    fake.hold.set()
    finally:
        fake.hold = None
    events, done = sse_json(lines)
    whole = http.post("/generate", json={**req, "stream": False}).json()
    assert done and len(events) > 1
    for before, after in zip(events, events[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][:len(before["output_ids"])] == before["output_ids"]
        assert before["meta_info"]["finish_reason"] is None
    last = events[-1]
    assert (last["text"], last["output_ids"]) == (whole["text"], whole["output_ids"])
    assert last["meta_info"]["completion_tokens"] == 7
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 7}


def test_stop_token_is_reported_as_matched(served, script_ids):
    http, _ = served
    stop = script_ids[3]
    meta = http.post("/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 20, "stop_token_ids": [stop]}}).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}


def test_batches_and_n_answer_lists_in_order(served, script_ids):
    http, fake = served
    before = len(fake.of_type(GenerateReq))
    out = http.post("/generate", json={"text": ["Hi", "Hello there"], "rid": "b",
                                       "sampling_params": {"max_new_tokens": 2, "n": 2}}).json()
    assert [o["meta_info"]["id"] for o in out] == ["b_0", "b_1", "b_2", "b_3"]
    assert [o["index"] for o in out] == [0, 1, 2, 3]
    assert all(o["output_ids"] == script_ids[:2] for o in out)
    assert len(fake.of_type(GenerateReq)) - before == 4
    ids = http.post("/generate", json={"input_ids": [[1, 2], [3]], "sampling_params": [
        {"max_new_tokens": 1}, {"max_new_tokens": 3}]}).json()
    assert [o["meta_info"]["completion_tokens"] for o in ids] == [1, 3]


def test_logprobs_in_sglang_layout(served, script_ids):
    http, _ = served
    out = http.post("/generate", json={
        "input_ids": [7, 8, 9], "return_logprob": True, "logprob_start_len": 0,
        "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 2}}).json()
    meta = out["meta_info"]
    assert [e[1] for e in meta["output_token_logprobs"]] == script_ids[:2]
    assert all(isinstance(e[2], str) for e in meta["output_token_logprobs"])
    # the first prompt token is listed with no logprob, as SGLang lists it
    assert meta["input_token_logprobs"][0][:2] == [None, 7]


def test_router_and_client_extras_are_accepted_while_empty(served):
    http, fake = served
    before = len(fake.of_type(GenerateReq))
    ok = http.post("/generate", json={"text": "Hi", "model": "smollm2", "lora_path": None,
                                      "return_routed_experts": False, "image_data": None,
                                      "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200, ok.text
    for extra, needle in [({"lora_path": "a"}, "lora_path"),
                          ({"sampling_params": {"max_new_tokens": 1, "nope": 1}}, "nope"),
                          ({"top_logprobs_num": 99}, "top_logprobs_num")]:
        r = http.post("/generate", json={"text": "Hi", "model": "m", **extra})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert len(fake.of_type(GenerateReq)) == before + 1  # refused ones never reached it


def test_model_server_info_and_models(served):
    http, _ = served
    for path in ("/get_model_info", "/model_info"):
        info = http.get(path).json()
        assert info["model_path"] == "smollm2" and info["is_generation"] is True
        assert info["model"] == "smollm2" and info["max_model_len"] > 0
    for path in ("/server_info", "/get_server_info"):
        info = http.get(path).json()
        assert info["model_path"] == "smollm2" and "api_key" not in info
        # the fake scheduler sends no stats: internal_states stays empty here
        assert info["max_total_num_tokens"] > 0 and info["internal_states"] == []
    [card] = http.get("/v1/models").json()["data"]
    assert card["id"] == "smollm2" and card["max_model_len"] == info["context_length"]


def test_flush_cache_health_generate_and_encode(served, tok):
    http, fake = served
    r = http.post("/flush_cache", headers=JSON)
    assert r.status_code == 200 and "flushed" in r.text
    assert fake.of_type(FlushCache)
    assert http.get("/health_generate").status_code == 200
    enc = http.post("/encode", json={"text": "Hello world"}).json()
    assert enc["tokens"] == tok.encode("Hello world") and enc["count"] == len(enc["tokens"])
    many = http.post("/tokenize", json={"prompt": ["a", "b c"]}).json()
    assert many["tokens"] == [tok.encode("a"), tok.encode("b c")]


def test_abort_request_ends_a_running_stream(spec, cfg):
    with (
        FakeScheduler(cfg, lambda r: [5] * 10, stall=True) as fake,
        fronts(cfg, spec) as f,
        httpx.Client(base_url=f.url, timeout=BOUND_S) as http,
    ):
        events: list[dict] = []

        def stream() -> None:
            req = {"text": "Hi", "rid": "victim", "stream": True,
                   "sampling_params": {"max_new_tokens": 5}}
            with http.stream("POST", "/generate", json=req) as r:
                events.extend(sse_json(list(r.iter_lines()))[0])

        t = threading.Thread(target=stream)
        t.start()
        wait_until(lambda: fake.of_type(GenerateReq), BOUND_S, "the request to arrive")
        busy = http.post("/flush_cache", headers=JSON)
        assert busy.status_code == 400 and "running" in busy.json()["error"]["message"]
        assert http.post("/abort_request", json={"rid": "victim"}).status_code == 200
        t.join(BOUND_S)
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
