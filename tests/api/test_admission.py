"""Fair admission (one request cannot take the whole queue, one that never fits is a 400),
reusing a rid at once after its request was dropped, and OpenAI's error code and
text offsets (fake scheduler; TokenizerManager alone, or behind the HTTP front)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.errors import InvalidRequest, Overloaded
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.front_helpers import fronts
from tests.api.http_helpers import sse_json

MAX_RUNNING, MAX_QUEUE = 4, 12  # 16 sequences in flight; one request may run 16 // 4 = 4


def run(cfg, spec, body):
    async def main():
        tm = TokenizerManager(cfg, spec)
        await tm.start()
        try:
            await tm.wait_limits(10)
            return await body(tm)
        finally:
            await tm.close()

    return asyncio.run(main())


def test_one_request_cannot_take_the_queue_and_a_full_queue_is_429(cfg, spec, script_ids):
    cfg = cfg.replace(max_running=MAX_RUNNING, max_queue=MAX_QUEUE)

    async def body(tm):
        with pytest.raises(InvalidRequest, match="at most 4"):
            await tm.admit(5)  # never fits: a 400, not a retry-later
        await tm.admit(4)
        states = [await tm.open("Hi", SamplingParams()) for _ in range(4)]  # a big request
        other = await tm.open("Hi", SamplingParams())  # another client still gets in
        states += [other] + [await tm.open("Hi", SamplingParams()) for _ in range(9)]
        with pytest.raises(Overloaded, match="retry later"):
            await tm.admit(3)  # 14 in flight: does not fit now, but would later
        await tm.admit(2)
        states += [await tm.open("Hi", SamplingParams()) for _ in range(2)]
        with pytest.raises(Overloaded, match="queue is full"):
            await tm.open("Hi", SamplingParams())
        for s in states:
            tm.release(s)
        await tm.admit(4)

    with FakeScheduler(cfg, lambda r: script_ids, stall=True):
        run(cfg, spec, body)


def test_a_many_prompt_request_that_can_never_fit_is_a_400(cfg, spec, script_ids):
    cfg = cfg.replace(max_running=MAX_RUNNING, max_queue=MAX_QUEUE)
    with FakeScheduler(cfg, lambda r: script_ids) as fake, fronts(cfg, spec) as f:
        for prompts, n in ((["Hi"] * 200, 16), (["Hi"] * 3, 2)):
            body = {"model": "smollm2", "prompt": prompts, "n": n, "max_tokens": 2}
            r = httpx.post(f"{f.url}/v1/completions", json=body, timeout=30)
            assert r.status_code == 400, r.text
            assert f"runs {len(prompts) * n} sequences" in r.json()["error"]["message"]
        assert not fake.of_type(GenerateReq)
        body = {"model": "smollm2", "prompt": ["Hi", "Yo"], "n": 2, "max_tokens": 2}
        r = httpx.post(f"{f.url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"]) == 4


def test_a_rid_can_be_reused_right_after_its_request_was_dropped(cfg, spec, script_ids):
    n = 6

    async def body(tm):
        first = tm.generate("Hi", SamplingParams(max_tokens=n), rid="mine")
        await anext(first)
        await first.aclose()  # the client went away; the scheduler still holds it
        return [c async for c in tm.generate("Hi", SamplingParams(max_tokens=n), rid="mine")]

    with FakeScheduler(cfg, lambda r: script_ids, per_msg=1, step_s=0.02) as fake:
        chunks = run(cfg, spec, body)
    assert {c.rid for c in chunks} == {"mine"}
    assert chunks[-1].finish_reason == "length"
    assert [t for c in chunks for t in c.token_ids] == script_ids[:n]
    keys = [g.rid for g in fake.of_type(GenerateReq)]
    assert len(set(keys)) == 2 and "mine" not in keys


def test_a_rid_in_flight_cannot_be_used_twice(cfg, spec, script_ids):
    async def body(tm):
        state = await tm.open("Hi", SamplingParams(), "dup")
        with pytest.raises(InvalidRequest, match="already in flight"):
            await tm.open("Hi", SamplingParams(), "dup")
        tm.release(state)

    with FakeScheduler(cfg, lambda r: script_ids, stall=True):
        run(cfg, spec, body)


def test_context_overflow_has_the_openai_error_code(cfg, spec, script_ids):
    with FakeScheduler(cfg, lambda r: script_ids), fronts(cfg, spec) as f:
        for path, body in (
            ("/v1/completions", {"prompt": "Hi", "max_tokens": spec.max_context}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 9000}]}),
            ("/v1/completions", {"prompt": [5] * spec.max_context, "max_tokens": 1}),
        ):
            r = httpx.post(f"{f.url}{path}", json={"model": "smollm2", **body}, timeout=30)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "context_length_exceeded"
            assert "context length" in r.json()["error"]["message"]


def test_streamed_completion_text_offsets_run_over_the_whole_text(cfg, spec, script_ids):
    body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 12, "logprobs": 0, "stream": True}
    with (
        FakeScheduler(cfg, lambda r: script_ids, per_msg=1, step_s=0.02),
        fronts(cfg, spec) as f,
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{f.url}/v1/completions", json=body) as r,
    ):
        events, done = sse_json(list(r.iter_lines()))
    assert done
    chunks = [e["choices"][0] for e in events if e["choices"][0]["logprobs"]["tokens"]]
    assert len(chunks) >= 2  # however a slow reader merges them, offsets must run on
    before = 0
    for c in chunks:
        offsets = c["logprobs"]["text_offset"]
        assert offsets[0] == before, json.dumps(chunks)
        assert offsets == sorted(offsets)
        before += len(c["text"])
