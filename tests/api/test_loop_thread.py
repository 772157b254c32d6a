"""LoopThread: driving the TokenizerManager from synchronous code, as the offline Engine does."""

from __future__ import annotations

import asyncio
import signal

import pytest

from runtime.api.loop_thread import LoopThread
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq
from tests.api.fake_scheduler import FakeScheduler


class Interrupted(Exception):
    pass


def test_sync_iteration_and_early_break(cfg, spec, tok, script_ids):
    lt = LoopThread()
    tm = TokenizerManager(cfg, spec)
    with FakeScheduler(cfg, lambda r: script_ids * 20, step_s=0.01) as fake:
        lt.run(tm.start())
        chunks = list(lt.iterate(tm.generate("Hi", SamplingParams(max_tokens=len(script_ids)))))
        assert "".join(c.text for c in chunks) == tok.decode(script_ids)
        for i, _ in enumerate(lt.iterate(tm.generate("Hi", SamplingParams(max_tokens=900)))):
            if i == 1:
                break
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
        assert lt.run(_inflight(tm)) == 0
        lt.run(tm.close())
    lt.close()


def test_interrupted_mid_step_still_aborts(cfg, spec, script_ids):
    """An exception in the consumer thread while it waits (Ctrl-C) closes the stream."""
    lt = LoopThread()
    tm = TokenizerManager(cfg, spec)

    def interrupt(*_):
        raise Interrupted

    old = signal.signal(signal.SIGALRM, interrupt)
    with FakeScheduler(cfg, lambda r: script_ids, stall=True) as fake:
        lt.run(tm.start())
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            with pytest.raises(Interrupted):
                list(lt.iterate(tm.generate("Hi", SamplingParams())))
        finally:
            signal.signal(signal.SIGALRM, old)
        assert fake.wait_for(lambda: fake.of_type(AbortReq))
        assert lt.run(_inflight(tm)) == 0
        lt.run(tm.close())
    lt.close()


def test_submit_and_run(cfg):
    lt = LoopThread()
    assert lt.run(asyncio.sleep(0.01, result=7)) == 7
    assert lt.submit(asyncio.sleep(0, result="x")).result(1) == "x"
    lt.close()
    lt.close()  # idempotent


async def _inflight(tm):
    return tm.num_inflight
