"""User-facing HTTP paths over a scripted scheduler: a request that fails in the engine
(500 before the response starts, an error event then `[DONE]` after), streaming with
`n > 1`, stop strings through SSE, and client disconnects on every route, a request still
waiting included. The api runs in this process over `FakeScheduler`, which answers with
`SCRIPT_TEXT`'s tokens."""

from __future__ import annotations

import threading

import httpx
import pytest

from runtime.wire.scheduler_input import AbortReq, GenerateReq
from tests.api.conftest import SCRIPT_TEXT
from tests.api.fake_scheduler import FakeScheduler
from tests.api.http.test_health import http_front
from tests.api.http_helpers import sse_json

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
ROUTES = {  # route -> body (without the stream flag) asking for the whole script
    "/v1/completions": {"prompt": "Hi", "max_tokens": 64},
    "/v1/chat/completions": {**CHAT, "max_tokens": 64},
    "/generate": {"text": "Hi", "sampling_params": {"max_tokens": 64}},
}


def body(route: str, cfg, **extra) -> dict:
    out = {**ROUTES[route], **extra}
    return out if route == "/generate" else {"model": cfg.model, **out}


@pytest.mark.parametrize("route", list(ROUTES))
def test_engine_failure_before_output_is_a_500(cfg, spec, script_ids, route):
    with FakeScheduler(cfg, lambda r: script_ids) as fs, http_front(cfg, spec) as url:
        fs.error = "worker failed on this request"
        for stream in (False, True):  # a stream answers only once its first output is known
            r = httpx.post(url + route, json=body(route, cfg, stream=stream), timeout=30)
            assert r.status_code == 500, r.text
            assert "worker failed" in r.json()["error"]["message"]


@pytest.mark.parametrize("route", list(ROUTES))
def test_engine_failure_mid_stream_is_the_last_event(cfg, spec, script_ids, route):
    hold = threading.Event()
    with FakeScheduler(cfg, lambda r: script_ids) as fs, http_front(cfg, spec) as url:
        fs.hold = hold  # the first step only, until released
        with httpx.stream("POST", url + route, json=body(route, cfg, stream=True),
                          timeout=30) as s:
            assert s.status_code == 200
            lines = s.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            fs.error = "worker failed on this request"
            hold.set()
            events, done = sse_json([first, *lines])
    assert done and "worker failed" in events[-1]["error"]["message"]
    assert "error" not in events[0]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_n_streams_each_choice_to_its_own_whole_text(cfg, spec, script_ids, route, tok):
    n = 3
    with FakeScheduler(cfg, lambda r: script_ids), http_front(cfg, spec) as url:
        whole = httpx.post(url + route, json=body(route, cfg, n=n), timeout=30).json()
        with httpx.stream("POST", url + route, json=body(route, cfg, n=n, stream=True),
                          timeout=30) as s:
            events, done = sse_json(list(s.iter_lines()))
    assert done
    texts, finish = {i: "" for i in range(n)}, {}
    for ev in events:
        for c in ev["choices"]:
            piece = c["delta"].get("content") if "delta" in c else c["text"]
            texts[c["index"]] += piece or ""
            if c["finish_reason"] is not None:
                finish[c["index"]] = c["finish_reason"]
    expected = tok.decode(script_ids, skip_special_tokens=True)
    assert texts == {i: expected for i in range(n)}
    assert finish == {i: "stop" for i in range(n)}  # the script ends before max_tokens
    for c in whole["choices"]:
        got = c["message"]["content"] if "message" in c else c["text"]
        assert got == expected and c["finish_reason"] == "stop"


@pytest.mark.parametrize("route", list(ROUTES))
def test_stop_string_ends_the_stream_before_it(cfg, spec, script_ids, route):
    stop = "Answer"
    expected = SCRIPT_TEXT[: SCRIPT_TEXT.index(stop)]
    extra = ({"sampling_params": {"max_tokens": 64, "stop": [stop]}} if route == "/generate"
             else {"stop": [stop]})
    with FakeScheduler(cfg, lambda r: script_ids, per_msg=1), http_front(cfg, spec) as url:
        with httpx.stream("POST", url + route, json=body(route, cfg, stream=True, **extra),
                          timeout=30) as s:
            events, done = sse_json(list(s.iter_lines()))
        whole = httpx.post(url + route, json=body(route, cfg, **extra), timeout=30).json()
    assert done
    if route == "/generate":  # native deltas: `text` pieces, the last one finished
        streamed = "".join(ev["text"] for ev in events)
        assert events[-1]["finish_reason"] == "stop" and whole["text"] == expected
    else:
        chunks = [c for ev in events for c in ev["choices"]]
        streamed = "".join((c["delta"].get("content") if "delta" in c else c["text"]) or ""
                           for c in chunks)
        assert chunks[-1]["finish_reason"] == "stop"
        choice = whole["choices"][0]
        assert (choice["message"]["content"] if "message" in choice else choice["text"]) \
            == expected
    assert streamed.strip() == expected.strip() and stop not in streamed


def _aborted(fs: FakeScheduler) -> set[str]:
    return {m.rid for m in fs.of_type(AbortReq)}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("n", [1, 2])
def test_disconnect_mid_stream_aborts_every_sequence(cfg, spec, script_ids, route, n):
    if route == "/generate" and n > 1:
        pytest.skip("the native form runs one sequence a request")
    hold = threading.Event()
    with FakeScheduler(cfg, lambda r: script_ids) as fs, http_front(cfg, spec) as url:
        fs.hold = hold  # one step each, then wait: the stream stays open
        extra = {"n": n} if n > 1 else {}
        with httpx.stream("POST", url + route, json=body(route, cfg, stream=True, **extra),
                          timeout=30) as s:
            next(s.iter_lines())  # the response started
            assert fs.wait_for(lambda: len(fs.of_type(GenerateReq)) == n)
        # closing the response disconnects: every sequence of the request is aborted
        rids = {m.rid for m in fs.of_type(GenerateReq)}
        assert fs.wait_for(lambda: _aborted(fs) == rids, timeout=10), (rids, _aborted(fs))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", list(ROUTES))
def test_disconnect_while_waiting_aborts_the_queued_request(cfg, spec, script_ids, route,
                                                            stream):
    """A request the scheduler never starts: the client gives up before any answer (a
    stream's headers too wait for its first output), and the request is aborted."""
    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fs, \
            http_front(cfg, spec) as url:
        with pytest.raises(httpx.ReadTimeout):  # the client closes its connection
            httpx.post(url + route, json=body(route, cfg, stream=stream), timeout=0.5)
        assert fs.wait_for(lambda: len(fs.of_type(GenerateReq)) == 1)
        (rid,) = {m.rid for m in fs.of_type(GenerateReq)}
        assert fs.wait_for(lambda: _aborted(fs) == {rid}, timeout=10)
