"""Greedy outputs of every engine configuration equal HF transformers', token for token."""

from __future__ import annotations

import pytest

from runtime import Engine, SamplingParams
from tests.e2e.hf_reference import PROMPTS, assert_matches, shared_reference

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def hf():
    return shared_reference()


def run_and_compare(hf, eng: Engine) -> None:
    outs = eng.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    assert len(outs) == len(PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        ids = hf.tokenizer.encode(prompt)
        ref, gaps = hf.greedy(ids, MAX_TOKENS)
        assert_matches(out.token_ids, ref, gaps, repr(prompt[:40]))
        assert out.finish_reason == ("stop" if len(ref) < MAX_TOKENS else "length")
        assert out.text == hf.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    stats = eng.stats()
    assert stats.invariant_error is None
    assert stats.running == 0 and stats.waiting == 0
    assert stats.kv_used == 0  # every slot free or evictable cache
    return stats


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_greedy_matches_hf_with_chunking_and_prefix_hits(hf, overlap):
    with Engine(model="smollm2", overlap=overlap, chunk_size=64, torch_threads=2) as eng:
        run_and_compare(hf, eng)
        # again, now that finished requests sit in the radix cache: hits, same tokens
        stats = run_and_compare(hf, eng)
        assert stats.prefix_hit_tokens >= sum(len(hf.tokenizer.encode(p)) - 1 for p in PROMPTS)


def test_greedy_matches_hf_when_the_pool_forces_retraction(hf):
    with Engine(model="smollm2", kv_slots=420, chunk_size=128, torch_threads=2,
                schedule_conservativeness=0.0) as eng:
        stats = run_and_compare(hf, eng)
        assert stats.num_retractions > 0
