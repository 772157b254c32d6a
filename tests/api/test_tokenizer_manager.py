"""TokenizerManager against a scripted fake scheduler (real SmolLM2 tokenizer)."""

from __future__ import annotations

import asyncio
import threading

import msgspec
import pytest
import zmq

from runtime.api.tokenizer_manager import TokenizerManager
from runtime.model_config import resolve_model
from runtime.wire.api_input import Limits
from runtime.wire.errors import EngineDeadError, InvalidRequest, Overloaded, RequestFailed
from runtime.wire.lifecycle import ProcessDied, Shutdown
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, FinishReq, GenerateReq
from tests.api.fake_scheduler import FakeScheduler


def run(cfg, spec, body):
    """Run `body(tm)` on a fresh event loop with a started TokenizerManager."""
    async def main():
        tm = TokenizerManager(cfg, spec)
        await tm.start()
        try:
            return await body(tm)
        finally:
            await tm.close()
    return asyncio.run(main())


async def collect(agen):
    return [c async for c in agen]


def test_stream_matches_full_decode(cfg, spec, tok, script_ids):
    n = len(script_ids)
    with FakeScheduler(cfg, lambda r: script_ids, cached_tokens=2) as fake:
        fake.hold = threading.Event()  # the first chunk alone, then the rest

        async def body(tm):
            chunks = []
            async for c in tm.generate("Tell me a story",
                                       SamplingParams(max_tokens=n, logprobs=True)):
                chunks.append(c)
                fake.hold.set()
            return chunks

        chunks = run(cfg, spec, lambda tm: asyncio.wait_for(body(tm), 30))  # a bound only
    assert len(chunks) >= 2
    assert "".join(c.text for c in chunks) == tok.decode(script_ids, skip_special_tokens=True)
    assert [t for c in chunks for t in c.token_ids] == script_ids
    assert [p for c in chunks for p in c.logprobs] == [-0.5] * n
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    prompt_len = len(tok.encode("Tell me a story"))
    assert chunks[-1].prompt_tokens == prompt_len and chunks[-1].cached_tokens == 2
    assert chunks[-1].completion_tokens == n
    req = fake.of_type(GenerateReq)[0]
    assert req.input_ids == tok.encode("Tell me a story")
    assert req.stop_ids == list(spec.eos_token_ids)
    assert not fake.of_type(AbortReq)


def test_stop_ids_include_eos_unless_ignore_eos(cfg, spec, script_ids):
    async def body(tm):
        await collect(tm.generate([5, 6], SamplingParams(max_tokens=3, stop_token_ids=[7])))
        await collect(tm.generate([5, 6], SamplingParams(max_tokens=3, stop_token_ids=[7],
                                                         ignore_eos=True)))
    with FakeScheduler(cfg, lambda r: script_ids) as fake:
        run(cfg, spec, body)
    assert [r.stop_ids for r in fake.of_type(GenerateReq)] == [[7, *spec.eos_token_ids], [7]]


def test_stop_string_trims_and_finishes_it_in_the_scheduler(cfg, spec, tok, script_ids):
    full = tok.decode(script_ids)
    with FakeScheduler(cfg, lambda r: script_ids) as fake:
        chunks = run(cfg, spec, lambda tm: collect(
            tm.generate("hi", SamplingParams(max_tokens=200, stop=["END", "nope"]))))
        key = fake.of_type(GenerateReq)[0].rid  # the scheduler's id of the request
        assert fake.wait_for(lambda: any(f.rid == key for f in fake.of_type(FinishReq)))
    text = "".join(c.text for c in chunks)
    assert text == full[:full.index("END")]
    ids = [t for c in chunks for t in c.token_ids]
    assert ids == script_ids[:len(ids)] and "END" in tok.decode(ids)
    assert "END" not in tok.decode(ids[:-1])
    assert chunks[-1].finish_reason == "stop" and chunks[-1].completion_tokens == len(ids)
    assert not fake.of_type(AbortReq)


def test_invalid_requests_never_reach_the_scheduler(cfg, spec, script_ids):
    long_prompt = [5] * spec.max_context
    bad = [
        ("", SamplingParams(), "empty"),
        ([], SamplingParams(), "empty"),
        ([5, -1], SamplingParams(), "outside the vocabulary"),
        ([5, 10**6], SamplingParams(), "outside the vocabulary"),
        ([5, "x"], SamplingParams(), "must be ints"),
        ([5, True], SamplingParams(), "must be ints"),
        (3.5, SamplingParams(), "string or a list"),
        (long_prompt, SamplingParams(max_tokens=1), f"at most {spec.max_context - 1}"),
        ([5] * 100, SamplingParams(max_tokens=spec.max_context), "exceeds the context length"),
        ("hi", SamplingParams(temperature=-1), "temperature"),
        ("hi", SamplingParams(top_p=0), "top_p"),
        ("hi", SamplingParams(stop=[""]), "stop"),
        ("hi", {"max_tokens": 3}, "SamplingParams"),
    ]

    async def body(tm):
        for prompt, params, words in bad:
            with pytest.raises(InvalidRequest, match=words):
                await collect(tm.generate(prompt, params))
        assert tm.num_inflight == 0
        return await collect(tm.generate("still fine", SamplingParams(max_tokens=4)))

    with FakeScheduler(cfg, lambda r: script_ids) as fake:
        chunks = run(cfg, spec, body)
    assert chunks[-1].finish_reason == "length"
    assert len(fake.of_type(GenerateReq)) == 1


def test_closing_the_stream_early_aborts(cfg, spec, script_ids):
    async def body(tm):
        agen = tm.generate("hi", SamplingParams(max_tokens=500))
        await agen.__anext__()
        await agen.aclose()
        assert tm.num_inflight == 0

    with FakeScheduler(cfg, lambda r: script_ids * 20, step_s=0.02) as fake:
        run(cfg, spec, body)
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
    key = fake.of_type(GenerateReq)[0].rid  # the scheduler's id of the request
    assert [(a.rid, a.reason) for a in fake.of_type(AbortReq)] == [(key, "abort")]


async def until(pred) -> None:
    """Yield to the loop until `pred()` holds (a state to reach, not a time to wait)."""
    while not pred():
        await asyncio.sleep(0.001)


def test_cancelling_the_consumer_task_aborts(cfg, spec, script_ids):
    async def body(tm):
        async def consume():
            async for _ in tm.generate("hi", SamplingParams(max_tokens=500)):
                pass
        task = asyncio.create_task(consume())
        await until(lambda: tm.num_inflight == 1)  # submitted: the scheduler holds it
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert tm.num_inflight == 0

    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fake:
        run(cfg, spec, body)
        assert fake.wait_for(lambda: fake.of_type(AbortReq))


def test_abort_by_rid(cfg, spec, script_ids):
    async def body(tm):
        agen = tm.generate("hi", SamplingParams(max_tokens=500), rid="r1")
        task = asyncio.create_task(collect(agen))
        await until(lambda: tm.num_inflight == 1)
        tm.abort("r1")
        return await task

    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fake:
        chunks = run(cfg, spec, body)
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
    assert chunks[-1].finish_reason == "abort" and chunks[-1].rid == "r1"
    assert [a.rid for a in fake.of_type(AbortReq)] == [fake.of_type(GenerateReq)[0].rid]


def test_process_died_fails_inflight_fast_and_later_calls(cfg, spec, script_ids):
    async def body(tm):
        tasks = [asyncio.create_task(collect(tm.generate(f"p{i}", SamplingParams())))
                 for i in range(3)]
        await until(lambda: tm.num_inflight == 3)  # all three wait on the stalled scheduler
        ctx = zmq.Context()
        sup = ctx.socket(zmq.PUSH)
        sup.connect(cfg.ipc("api_in"))
        sup.send(msgspec.msgpack.encode(ProcessDied("worker", -9)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        sup.close(linger=0)
        ctx.term()
        with pytest.raises(EngineDeadError, match="worker process died"):
            await collect(tm.generate("again", SamplingParams()))
        return results, tm.dead

    with FakeScheduler(cfg, lambda r: script_ids, stall=True):
        results, dead = run(cfg, spec, body)
    # failed by the death itself (nothing else would end a stalled request)
    assert all(isinstance(r, EngineDeadError) for r in results)
    assert "exit code -9" in str(results[0]) and dead is results[0]


def test_scheduler_error_fails_only_that_request(cfg, spec, script_ids):
    async def body(tm):
        fake.error = "CUDA exploded"
        with pytest.raises(RequestFailed, match="CUDA exploded"):
            await collect(tm.generate("hi", SamplingParams()))
        fake.error = None
        return await collect(tm.generate("hi", SamplingParams(max_tokens=2)))

    with FakeScheduler(cfg, lambda r: script_ids) as fake:
        chunks = run(cfg, spec, body)
    assert chunks[-1].finish_reason == "length"


def test_many_concurrent_requests_are_demultiplexed(cfg, spec, tok):
    script = lambda req: tok.encode(f" answer to {req.input_ids[-1]} 😀 done")  # noqa: E731

    async def body(tm):
        prompts = [[5, 100 + i] for i in range(20)]
        outs = await asyncio.gather(*(collect(tm.generate(p, SamplingParams(max_tokens=50)))
                                      for p in prompts))
        return ["".join(c.text for c in chunks) for chunks in outs]

    with FakeScheduler(cfg, script, per_msg=2):
        texts = run(cfg, spec, body)
    assert texts == [f" answer to {100 + i} 😀 done" for i in range(20)]


def test_close_with_shutdown_tells_the_scheduler(cfg, spec, script_ids):
    async def body(tm):
        await tm.close(shutdown_scheduler=True)

    with FakeScheduler(cfg, lambda r: script_ids) as fake:
        run(cfg, spec, body)
        assert fake.wait_for(lambda: fake.of_type(Shutdown))


def test_model_without_tokenizer_streams_ids_only(cfg):
    spec = resolve_model("dummy:tiny")

    async def body(tm):
        with pytest.raises(InvalidRequest, match="no tokenizer"):
            await collect(tm.generate("text", SamplingParams()))
        with pytest.raises(InvalidRequest, match="no tokenizer"):
            await collect(tm.generate([1, 2], SamplingParams(stop=["x"])))
        return await collect(tm.generate([1, 2, 3], SamplingParams(max_tokens=5)))

    with FakeScheduler(cfg, lambda r: [10, 11, 12, 13, 14, 15]):
        chunks = run(cfg, spec, body)
    assert [t for c in chunks for t in c.token_ids] == [10, 11, 12, 13, 14]
    assert all(c.text == "" for c in chunks)
    assert chunks[-1].finish_reason == "length"


def test_the_schedulers_limits_govern_every_check(cfg, spec, script_ids):
    """The limits the scheduler reports (a 256-token context, as a sliding window caps it)
    are the ones the api checks and advertises, not the model's own 8192 or the config."""
    limits = Limits(max_context=256, max_req_input_len=255, max_running=1, kv_slots=4096,
                    model_max_context=spec.max_context)
    cfg = cfg.replace(max_queue=1)  # with limits.max_running: two in flight at most

    async def body(tm):
        assert (await tm.wait_limits(5)) == limits
        assert tm.context_len == 256 and tm.model_info().max_model_len == 256
        with pytest.raises(InvalidRequest, match="at most 255 prompt tokens"):
            await collect(tm.generate([5] * 256, SamplingParams(max_tokens=0)))
        with pytest.raises(InvalidRequest, match="exceeds the context length of 256 tokens"):
            await collect(tm.generate([5] * 100, SamplingParams(max_tokens=157)))
        tasks = [asyncio.create_task(anext(tm.generate([5] * 100, SamplingParams(
            max_tokens=156)))) for _ in range(2)]
        await until(lambda: tm.num_inflight == 2)
        with pytest.raises(Overloaded, match="max_running=1, max_queue=1"):
            await collect(tm.generate("hi", SamplingParams()))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    with FakeScheduler(cfg, lambda r: script_ids, stall=True, limits=limits) as fake:
        run(cfg, spec, body)
    assert len(fake.of_type(GenerateReq)) == 2


def test_requests_wait_for_the_limits_and_fail_if_the_engine_dies_first(cfg, spec):
    async def body(tm):
        task = asyncio.create_task(collect(tm.generate("hi", SamplingParams())))
        await asyncio.sleep(0.1)
        assert not task.done() and tm.limits is None
        ctx = zmq.Context()
        sup = ctx.socket(zmq.PUSH)
        sup.connect(cfg.ipc("api_in"))
        sup.send(msgspec.msgpack.encode(ProcessDied("scheduler", 1)))
        try:
            with pytest.raises(EngineDeadError, match="scheduler process died"):
                await asyncio.wait_for(task, 5)
            with pytest.raises(EngineDeadError):
                await tm.wait_limits(5)
        finally:
            sup.close(linger=0)
            ctx.term()

    run(cfg, spec, body)  # no scheduler: no limits ever arrive
