"""The offline Engine as a user sees it: streaming, sampling options, bad input, aborts."""

from __future__ import annotations

import threading
import time

import pytest

from runtime import Engine, InvalidRequest, SamplingParams
from runtime.model_errors import ModelNotFound


@pytest.fixture(scope="module")
def eng():
    with Engine(model="smollm2", chunk_size=128, torch_threads=2) as engine:
        yield engine


def wait_idle(eng: Engine, deadline_s: float = 30.0):
    """Stats once the scheduler has settled: a request the api already finished (stop string,
    disconnect) may still sit in the batch in flight for a step or two."""
    end = time.monotonic() + deadline_s
    while True:
        stats = eng.stats()
        if stats.running == stats.waiting == stats.kv_used == 0 or time.monotonic() > end:
            return stats
        time.sleep(0.02)


def assert_idle(eng: Engine) -> None:
    stats = wait_idle(eng)
    assert stats.invariant_error is None
    assert stats.running == 0 and stats.waiting == 0 and stats.kv_used == 0


def test_streams_concatenate_to_generated_text_for_32_concurrent_requests(eng):
    prompts = [f"Count to {i}: 1," if i % 2 else f"Tell me about the number {i}."
               for i in range(32)]
    params = [SamplingParams(max_tokens=4 + (i * 7) % 37, temperature=0.0) for i in range(32)]
    whole: dict[int, object] = {}
    streamed: dict[int, list] = {}

    def consume(i: int) -> None:
        streamed[i] = list(eng.stream(prompts[i], params[i]))
        whole[i] = eng.generate(prompts[i], params[i])[0]

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i in range(32):
        chunks = streamed[i]
        assert "".join(c.text for c in chunks) == whole[i].text
        assert [t for c in chunks for t in c.token_ids] == whole[i].token_ids
        assert chunks[-1].finish_reason == whole[i].finish_reason
        assert all(c.finish_reason is None for c in chunks[:-1])
    assert_idle(eng)


def test_seeded_sampling_repeats_and_options_apply(eng):
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, top_k=40, seed=1234)
    a, b = eng.generate(["Once upon a time", "Once upon a time"], p)
    assert a.token_ids == b.token_ids
    other = eng.generate("Once upon a time", SamplingParams(max_tokens=16, temperature=0.9,
                                                             top_p=0.9, top_k=40, seed=99))[0]
    assert other.token_ids != a.token_ids
    greedy = eng.generate("Once upon a time", SamplingParams(max_tokens=16, temperature=0.0,
                                                             logprobs=True))[0]
    assert len(greedy.logprobs) == len(greedy.token_ids)
    assert all(lp <= 0.0 for lp in greedy.logprobs)
    penal = eng.generate("1, 1, 1, 1, 1, 1,", SamplingParams(
        max_tokens=12, temperature=0.0, repetition_penalty=1.5, ignore_eos=True))[0]
    plain = eng.generate("1, 1, 1, 1, 1, 1,", SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    assert penal.token_ids != plain.token_ids and len(penal.token_ids) == 12


def test_stop_strings_and_stop_token_ids(eng):
    base = eng.generate("1, 2, 3, 4, 5,", SamplingParams(max_tokens=20, temperature=0.0))[0]
    assert " 7" in base.text
    cut = eng.generate("1, 2, 3, 4, 5,", SamplingParams(max_tokens=20, temperature=0.0,
                                                        stop=[" 7"]))[0]
    assert cut.finish_reason == "stop" and cut.text == base.text[:base.text.index(" 7")]
    tok = base.token_ids[2]
    by_id = eng.generate("1, 2, 3, 4, 5,", SamplingParams(max_tokens=20, temperature=0.0,
                                                          stop_token_ids=[tok]))[0]
    assert by_id.finish_reason == "stop" and by_id.token_ids == base.token_ids[:3]
    assert_idle(eng)


def test_ids_only_outputs_skip_the_text(eng):
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    full = eng.generate("1, 2, 3,", p)[0]
    ids = eng.generate("1, 2, 3,", p, text=False)[0]
    assert full.text and ids.text == "" and ids.token_ids == full.token_ids
    chunks = list(eng.stream("1, 2, 3,", p, text=False))
    assert [t for c in chunks for t in c.token_ids] == full.token_ids
    assert all(c.text == "" for c in chunks) and chunks[-1].finish_reason == "length"
    with pytest.raises(InvalidRequest, match="stop strings"):
        eng.generate("1, 2, 3,", SamplingParams(stop=[" 7"]), text=False)
    assert_idle(eng)


@pytest.mark.parametrize("prompt, params, message", [
    ("", SamplingParams(max_tokens=4), "empty"),
    ("hi " * 9000, SamplingParams(max_tokens=4), "8192"),
    ("hi", SamplingParams(max_tokens=-1), "max_tokens"),
    ("hi", SamplingParams(temperature=-0.5), "temperature"),
    ("hi", SamplingParams(top_p=0.0), "top_p"),
    ("hi", SamplingParams(top_p=1.5), "top_p"),
    ([1, 2, 10**9], SamplingParams(max_tokens=4), "vocabulary"),
])
def test_bad_input_raises_typed_error_and_costs_nothing(eng, prompt, params, message):
    with pytest.raises(InvalidRequest, match=message):
        eng.generate(prompt, params)
    ok = eng.generate("Hello", SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert len(ok.token_ids) == 3
    assert_idle(eng)


def probe(eng: Engine, k: int = 4) -> None:
    """A request of exactly `k` tokens, alone: the scheduler plans exactly `k` steps for it
    (its prefill samples the first token, each decode one more)."""
    params = SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True)
    assert len(eng.generate("1, 2, 3,", params)[0].token_ids) == k


def test_breaking_out_of_a_stream_aborts_it_and_no_step_runs_for_it_after(eng):
    probe(eng)  # its prompt cached from here on
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    before = wait_idle(eng).num_steps
    stream = eng.stream("Write a very long story about a dragon.", params)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    acked = wait_idle(eng)  # the abort acknowledged: nothing runs, no KV held
    assert acked.running == acked.kv_used == 0 and acked.invariant_error is None
    assert acked.num_steps - before < 400  # it did not run to its end (400 steps)
    # event, not clock: a probe's steps are exactly its own, so nothing else was planned
    probe(eng)
    assert wait_idle(eng).num_steps - acked.num_steps == 4


def test_unknown_model_path_is_a_clear_error():
    with pytest.raises(ModelNotFound, match="neither"):
        Engine(model="/no/such/model")
