"""Prompt text is tokenized off the event loop when long, and rejected untokenized when
far too long; an over-long id list is rejected before its ids are looked at."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.api.prompt_tokenizer import INLINE_CHARS, PromptTokenizer
from runtime.wire.api_input import Limits
from runtime.wire.errors import InvalidRequest
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from tests.api.fake_scheduler import FakeScheduler
from tests.api.test_tokenizer_manager import collect, run


class RecordingTokenizer:
    """The real tokenizer, noting the thread of every `encode` call."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.threads: list[threading.Thread] = []

    def get_vocab(self) -> dict[str, int]:
        return self.tok.get_vocab()

    def encode(self, text: str, **kw) -> list[int]:
        self.threads.append(threading.current_thread())
        return self.tok.encode(text, **kw)


def test_long_text_is_tokenized_off_the_loop_short_text_on_it(tok):
    recording = RecordingTokenizer(tok)
    prompts = PromptTokenizer(recording)
    short, long = "Hello world!", "Hello world! " * (INLINE_CHARS // 4)

    async def main():
        ids = [await prompts.encode(t, 8191) for t in (short, long)]
        ids.append(await prompts.encode(long, 8191, add_special_tokens=False))
        return ids

    try:
        ids = asyncio.run(main())
    finally:
        prompts.close()
    assert ids == [tok.encode(short), tok.encode(long), tok.encode(long, add_special_tokens=False)]
    loop_thread = threading.current_thread()
    assert recording.threads[0] is loop_thread
    assert all(t is not loop_thread for t in recording.threads[1:])


def test_text_far_over_the_limit_is_rejected_untokenized(tok):
    recording = RecordingTokenizer(tok)
    prompts = PromptTokenizer(recording)
    assert prompts.max_token_chars >= max(len(tok.decode([i])) for i in range(len(tok)))
    at_most = 100 * prompts.max_token_chars

    async def main():
        with pytest.raises(InvalidRequest, match=f"{at_most} characters at most"):
            await prompts.encode("x" * (at_most + 1), 100)
        return await prompts.encode("x" * at_most, 100)  # maybe too long: tokenized to tell

    try:
        ids = asyncio.run(main())
    finally:
        prompts.close()
    assert len(recording.threads) == 1 and ids == tok.encode("x" * at_most)


def test_the_token_manager_checks_length_before_content(cfg, spec, script_ids):
    limits = Limits(max_context=256, max_req_input_len=255, max_running=4, kv_slots=4096)

    async def body(tm):
        with pytest.raises(InvalidRequest, match="characters at most"):
            await collect(tm.generate("y" * 10**6, SamplingParams()))
        # the length is known from the list alone: its (bad) contents are never read
        with pytest.raises(InvalidRequest, match="at most 255 prompt tokens"):
            await collect(tm.generate([None] * 256, SamplingParams()))
        with pytest.raises(InvalidRequest, match="must be ints"):
            await collect(tm.generate([5, None], SamplingParams()))
        long_text = "word " * 200  # tokenized in a thread: fits
        return await collect(tm.generate(long_text, SamplingParams(max_tokens=3)))

    with FakeScheduler(cfg, lambda r: script_ids, limits=limits) as fake:
        chunks = run(cfg, spec, body)
    assert chunks[-1].finish_reason == "length"
    assert len(fake.of_type(GenerateReq)) == 1
