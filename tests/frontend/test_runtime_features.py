"""The runtime features the frontend needs, on SmolLM2: input (prompt) logprobs equal
HF's, and `gen(regex=...)` always matches, with the overlap scheduler on and off."""

from __future__ import annotations

import re

import pytest

import frontend as sl
from runtime import Engine, InvalidRequest, SamplingParams

DATE = r"\d{4}-\d{2}-\d{2}"
PERSON = r'\{"name": "[A-Za-z]{1,10}", "age": \d{1,2}\}'
TEXT = ("The Eiffel Tower is in Paris, the capital of France. It was built in 1889 for the "
        "World's Fair and is about 330 metres tall. Every year millions of people visit it.")


@pytest.fixture(scope="module")
def no_overlap_engine():
    with Engine(model="smollm2", chunk_size=32, torch_threads=2, overlap=False) as eng:
        yield eng


def close(ours: list[float], ref: list[float], atol: float = 1e-4) -> bool:
    return len(ours) == len(ref) and all(abs(a - b) <= atol for a, b in zip(ours, ref))


def test_input_logprobs_equal_hf_over_chunks_and_after_a_cached_prefix(engine, hf):
    ids = hf.encode(TEXT)  # ~40 tokens: two chunks of 32
    ref = hf.prompt_logprobs(ids)
    out = engine.generate(TEXT, SamplingParams(max_tokens=0, logprob_start_len=0))[0]
    assert out.token_ids == [] and out.finish_reason == "length"
    assert out.input_token_ids == ids[1:] and close(out.input_logprobs, ref)
    short = "Hello there, world"  # one chunk
    out = engine.generate(short, SamplingParams(max_tokens=0, logprob_start_len=1))[0]
    assert close(out.input_logprobs, hf.prompt_logprobs(hf.encode(short)))
    # the whole text is cached now: from position 25 on the logits are recomputed
    out = engine.generate(TEXT, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True,
                                               logprob_start_len=25))[0]
    assert 0 < out.cached_tokens <= 24
    assert out.input_token_ids == ids[25:] and close(out.input_logprobs, ref[24:])
    assert len(out.token_ids) == 3


@sl.function
def constrained(s, prompt, regex):
    s += prompt
    s += sl.gen("out", max_tokens=48, temperature=1.0, regex=regex)


@pytest.mark.parametrize("mode", ["overlap", "no-overlap"])
def test_gen_regex_always_matches_over_20_sampled_runs(mode, request):
    eng = request.getfixturevalue("engine" if mode == "overlap" else "no_overlap_engine")
    args = ([{"prompt": "Today's date is ", "regex": DATE}] * 20
            + [{"prompt": "A person as JSON: ", "regex": PERSON}] * 20)
    states = constrained.run_batch(args, backend=sl.EngineBackend(eng), precache=False)
    for arg, state in zip(args, states):
        assert re.fullmatch(arg["regex"], state["out"]), (arg["regex"], state["out"])
        # ended by EOS, which the mask allows only once the match is complete
        assert state.get_meta_info("out")["finish_reason"] == "stop"
    for regex in (DATE, PERSON):  # sampled, not one forced string
        assert len({s["out"] for a, s in zip(args, states) if a["regex"] == regex}) > 1


def test_invalid_regex_is_refused_before_the_scheduler(engine):
    with pytest.raises(InvalidRequest, match="invalid regex"):
        engine.generate("x", SamplingParams(regex="(ab"))
    assert engine.stats().waiting == 0
