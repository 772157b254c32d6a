"""The HTTP front of a real server (three processes, SmolLM2 on the CPU): the `openai`
package against /v1, raw SSE, /generate, bad input, 128 concurrent streams, disconnects."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import openai
import pytest

from tests.api.http_helpers import live_server, sse_json, wait_until

MODEL = "smollm2"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server():
    with live_server(stats_interval=0.2) as s:
        yield s


@pytest.fixture(scope="module")
def hf_model():
    from tests.e2e.hf_reference import shared_reference

    return shared_reference().model


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as c:
        yield c


def chat_prompt_len(tok) -> int:
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return len(tok.encode(text, add_special_tokens=False))


def test_models_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_completion_stream_concatenates_to_non_stream(client, tok):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    choice = full.choices[0]
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert full.usage.prompt_tokens == len(tok.encode(PROMPT))
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    if choice.finish_reason == "length":
        assert full.usage.completion_tokens == 8

    deltas, usage, finish = [], None, None
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            deltas.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(deltas) == choice.text
    assert finish == choice.finish_reason
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        full.usage.prompt_tokens, full.usage.completion_tokens)


def test_chat_stream_concatenates_to_non_stream(client, tok):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8,
                                          temperature=0)
    message = full.choices[0].message
    assert message.role == "assistant" and message.content
    assert full.usage.prompt_tokens == chat_prompt_len(tok)

    deltas, roles, usage = [], [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=CHAT,
                                                max_completion_tokens=8, temperature=0,
                                                stream=True,
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            roles += [c.delta.role] if c.delta.role else []
            deltas.append(c.delta.content or "")
        usage = chunk.usage or usage
    assert roles == ["assistant"]
    assert "".join(deltas) == message.content
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.completion_tokens == full.usage.completion_tokens


def test_raw_sse_ends_with_usage_then_done(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events, done = sse_json(list(r.iter_lines()))
    assert done
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all(e["usage"] is None for e in events[:-1])


def test_n_choices_seeds_and_logprobs(client, tok):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.9, seed=7, n=3,
              logprobs=0)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3  # each choice samples on its own
    solo = [client.completions.create(**{**kw, "n": 1, "seed": 7 + i}).choices[0].text
            for i in range(3)]
    assert solo == texts  # choice i is the request seeded seed + i
    assert a.usage.prompt_tokens == len(tok.encode(PROMPT))  # once, not once per choice
    for c in a.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset)
        assert all(x <= 0 for x in lp.token_logprobs)
    assert a.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in a.choices)

    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                          temperature=0, logprobs=True)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(t.logprob <= 0 for t in content)


def test_completion_top_logprobs_lead_with_the_greedy_token(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                    logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.top_logprobs) == 5
    for token, token_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == pytest.approx(token_lp)
        assert max(top.values()) == pytest.approx(token_lp)  # greedy: the most likely


def test_echo_with_logprobs_scores_the_prompt_as_hf_does(client, tok, hf_model):
    """What lm-evaluation-harness sends for a log-likelihood: echo, logprobs=1, and no (or
    one) new token; the prompt's logprobs must be the model's own."""
    import torch

    text = "The capital of France is Paris, and the capital of Italy is Rome."
    ids = tok.encode(text)
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0].float()  # [T, V]
    ref = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    whole = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True,
                                      logprobs=1, temperature=0)
    c = whole.choices[0]
    assert c.text == text and c.logprobs.tokens == [tok.decode([t]) for t in ids]
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert torch.allclose(torch.tensor(c.logprobs.token_logprobs[1:]), ref, atol=2e-3)
    assert all(max(top.values()) >= lp - 1e-6
               for lp, top in zip(c.logprobs.token_logprobs[1:], c.logprobs.top_logprobs[1:]))
    assert c.logprobs.text_offset[0] == 0 and c.logprobs.text_offset[-1] < len(text)
    one = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, echo=True,
                                    logprobs=1, temperature=0, stream=True)
    chunks = [ch.choices[0] for ch in one]
    assert "".join(ch.text for ch in chunks).startswith(text)
    scored = [x for ch in chunks if ch.logprobs for x in ch.logprobs.token_logprobs]
    assert len(scored) == len(ids) + 1 and scored[0] is None
    assert torch.allclose(torch.tensor(scored[1:-1]), ref, atol=2e-3)


def test_chat_top_logprobs(client):
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert t.top_logprobs[1].logprob <= t.logprob
        assert t.top_logprobs[1].bytes == list(t.top_logprobs[1].token.encode())


SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"},
                                           "color": {"enum": ["red", "green", "blue"]}},
          "required": ["age", "color"], "additionalProperties": False}


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
    {"type": "json_object"}])
def test_response_format_gives_json(client, fmt):
    messages = [{"role": "user", "content": "Describe a cat as JSON with its age and color."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48,
                                          temperature=0, response_format=fmt)
    choice = chat.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    value = json.loads(choice.message.content)
    assert isinstance(value, dict)
    if fmt["type"] == "json_schema":
        assert set(value) == {"age", "color"} and type(value["age"]) is int
        assert value["color"] in ("red", "green", "blue")


def test_native_generate_text_ids_and_stream(server, tok):
    url = f"{server.url}/generate"
    sp = {"max_tokens": 8, "temperature": 0}
    by_text = httpx.post(url, json={"text": PROMPT, "sampling_params": sp}, timeout=60).json()
    by_ids = httpx.post(url, json={"input_ids": tok.encode(PROMPT), "sampling_params": sp,
                                   "return_logprob": True}, timeout=60).json()
    assert by_text["text"] == by_ids["text"] and by_text["output_ids"] == by_ids["output_ids"]
    assert len(by_ids["logprobs"]) == len(by_ids["output_ids"])
    assert by_text["usage"]["prompt_tokens"] == len(tok.encode(PROMPT))

    body = {"text": PROMPT, "sampling_params": sp, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        events, done = sse_json(list(r.iter_lines()))
    assert done and "".join(e["text"] for e in events) == by_text["text"]
    assert [t for e in events for t in e["output_ids"]] == by_text["output_ids"]

    sp_top = {"max_tokens": 4, "temperature": 0, "top_logprobs": 3}
    top = httpx.post(url, json={"text": PROMPT, "sampling_params": sp_top}, timeout=60).json()
    assert len(top["logprobs"]) == len(top["top_logprobs"]) == 4
    for tok_id, lp, alts in zip(top["output_ids"], top["logprobs"], top["top_logprobs"]):
        assert len(alts) == 3 and alts[0] == [tok_id, pytest.approx(lp)]

    # SGLang's form: alternatives as [logprob, id, text] per token in meta_info
    sgl = httpx.post(url, json={"text": PROMPT, "return_logprob": True, "top_logprobs_num": 2,
                                "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                     timeout=60).json()
    meta = sgl["meta_info"]
    assert len(meta["output_top_logprobs"]) == len(sgl["output_ids"]) == 4
    for tok_id, (lp, _, _), alts in zip(sgl["output_ids"], meta["output_token_logprobs"],
                                        meta["output_top_logprobs"]):
        assert len(alts) == 2 and alts[0][:2] == [pytest.approx(lp), tok_id]

    body = {"text": PROMPT, "ignore_eos": True, "priority": 3,
            "sampling_params": {"max_tokens": 10, "temperature": 0}}
    free = httpx.post(url, json=body, timeout=60).json()["output_ids"]
    stop_id = free[4]  # a token greedy decoding takes fifth: the stop id must end it there
    body["sampling_params"]["stop_token_ids"] = [stop_id]
    forced = httpx.post(url, json=body, timeout=60).json()
    assert forced["output_ids"] == free[: free.index(stop_id) + 1]
    assert forced["finish_reason"] == "stop"


BAD = [
    ("/v1/completions", b'{"model": "smollm2", "prompt": ', 400, "malformed JSON"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400,
     "$.temperature"),
    ("/v1/completions", {"prompt": "x"}, 400, "model"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "gpt-4"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": [1] * 9000}, 400, "context length 8192"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 9000}, 400,
     "set max_tokens <="),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 17}, 400, "n must be"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "top_logprobs": 2}, 400,
     "top_logprobs needs logprobs=true"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "logprobs": True,
                              "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     400, "invalid json_schema"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT,
                              "response_format": {"type": "xml"}}, 400, "response_format"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokenz": 3}}, 400,
     "max_new_tokenz"),
    ("/generate", {"sampling_params": {}}, 400, "exactly one"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD)
def test_bad_input_gets_openai_error_json(server, path, body, status, needle):
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server.url}{path}", timeout=30, **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle in err["message"]


def test_unknown_path_is_a_json_404_and_serving_goes_on(server, client):
    r = httpx.get(f"{server.url}/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
    assert out.usage.completion_tokens >= 1


def test_128_concurrent_streams_finish_with_solo_text(server, tok):
    prompts = [PROMPT, "Hello", "List the planets: " + "Mercury, Venus, Earth, " * 8,
               "def fibonacci(n):", "The quick brown fox " * 12, "1, 2, 3, 4, 5,"]
    solo = [httpx.post(f"{server.url}/generate", timeout=60, json={
        "text": p, "sampling_params": {"max_tokens": 6, "temperature": 0}}).json()["output_ids"]
        for p in prompts]  # one at a time: the reference outputs
    lengths = (1, 2, 3, 5, 6)  # with 6 prompts, every pair occurs
    before = server.metrics()
    idle = before["sluice_kv_usage_ratio"]

    async def one(aclient: openai.AsyncOpenAI, i: int) -> tuple[int, int, str, str | None]:
        p, k = i % len(prompts), lengths[i % len(lengths)]
        text, finish = [], None
        stream = await aclient.completions.create(model=MODEL, prompt=prompts[p], max_tokens=k,
                                                  temperature=0, stream=True)
        async for chunk in stream:
            text.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        return p, k, "".join(text), finish

    async def run_all() -> list:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none",
                                      max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, i) for i in range(128)))

    results = asyncio.run(run_all())
    for p, k, text, finish in results:
        assert text == tok.decode(solo[p][:k], skip_special_tokens=True), (p, k)
        assert finish in ("stop", "length")

    def idle_again() -> bool:
        m = server.metrics()
        return (m["sluice_num_requests_running"] == 0 and m["sluice_num_requests_waiting"] == 0
                and m["sluice_kv_usage_ratio"] == idle)
    wait_until(idle_again, what="no running requests and idle KV usage")

    after = server.metrics()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    for name in ('sluice_requests_total{outcome="success"}',
                 "sluice_time_to_first_token_seconds_count",
                 "sluice_e2e_request_latency_seconds_count",
                 "sluice_request_queue_time_seconds_count"):
        assert delta[name] == 128, name
    generated = delta["sluice_generation_tokens_total"]
    assert generated >= 128
    assert delta["sluice_inter_token_latency_seconds_count"] == generated - 128
    assert after["sluice_prefix_cache_hit_rate"] > 0  # the solo runs cached every prompt


def _idle(server) -> bool:
    m = server.metrics()
    return m["sluice_num_requests_running"] == 0 and m["sluice_kv_slots_reserved"] == 0


def _steps(server) -> float:
    return server.metrics()["sluice_scheduler_steps_total"]


def _probe(server, k: int = 4) -> None:
    """A request of exactly `k` tokens, alone: the scheduler plans exactly `k` steps for it
    (its prefill samples the first token, each decode one more)."""
    body = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": k, "ignore_eos": True,
            "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == k


def test_stream_disconnect_aborts_and_no_step_runs_for_it_after(server):
    _probe(server)  # its prompt cached from here on
    aborts = server.metrics().get('sluice_requests_total{outcome="abort"}', 0)
    body = {"model": MODEL, "prompt": "Count to a million:", "max_tokens": 4000,
            "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http, \
            http.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
    wait_until(lambda: _idle(server), what="the aborted request's KV to be freed")
    m = server.metrics()
    assert m['sluice_requests_total{outcome="abort"}'] == aborts + 1
    # event, not clock: once the abort is acknowledged (idle, KV back), a probe's steps
    # are exactly its own, so nothing more was planned for the aborted request
    acked = m["sluice_scheduler_steps_total"]
    _probe(server)
    wait_until(lambda: _steps(server) >= acked + 4, what="the probe's steps in the stats")
    assert _steps(server) == acked + 4


def test_non_stream_disconnect_aborts(server):
    aborts = server.metrics().get('sluice_requests_total{outcome="abort"}', 0)
    body = (b'{"model": "smollm2", "prompt": "Count:", "max_tokens": 4000, '
            b'"ignore_eos": true}')
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        wait_until(lambda: server.metrics()["sluice_num_requests_running"] == 1,
                   what="the request to run")
    wait_until(lambda: _idle(server), what="the aborted request's KV to be freed")
    assert server.metrics()['sluice_requests_total{outcome="abort"}'] == aborts + 1
