"""Greedy outputs in the paged and contiguous KV modes equal HF transformers', token for token."""

from __future__ import annotations

import pytest

from runtime import Engine, SamplingParams
from tests.e2e.hf_reference import PROMPTS, assert_matches, shared_reference

MAX_TOKENS = 16
# shared-prefix prompts (block hits), a repeat, one longer than a chunk
SUBSET = [PROMPTS[i] for i in (0, 1, 3, 5, 6, 7, 14, 15)]
# of those, the ones HF runs to MAX_TOKENS: 2 blocks of 16 each, 10 wanted at once
NO_EARLY_STOP = [PROMPTS[i] for i in (0, 1, 3, 5, 14)]


@pytest.fixture(scope="module")
def hf():
    return shared_reference()


def run_and_compare(hf, eng: Engine, prompts: list[str] = SUBSET):
    outs = eng.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
    for prompt, out in zip(prompts, outs, strict=True):
        ref, gaps = hf.greedy(hf.tokenizer.encode(prompt), MAX_TOKENS)
        assert_matches(out.token_ids, ref, gaps, repr(prompt[:40]))
        assert out.finish_reason == ("stop" if len(ref) < MAX_TOKENS else "length")
    stats = eng.stats()
    assert stats.invariant_error is None
    assert stats.running == 0 and stats.waiting == 0 and stats.kv_used == 0
    return stats


def test_paged_matches_hf_and_hits_cached_blocks(hf):
    with Engine(model="smollm2", kv="paged", block_size=16, chunk_size=64,
                torch_threads=2) as eng:
        run_and_compare(hf, eng)
        stats = run_and_compare(hf, eng)  # again: every prompt's full blocks are cached
        blocks = sum((len(hf.tokenizer.encode(p)) - 1) // 16 * 16 for p in SUBSET)
        assert stats.prefix_hit_tokens >= blocks > 0


def test_dynamic_block_sizes_of_every_class_match_hf(hf):
    """`--block-size dynamic` as served: the pool is cut into 64-slot superblocks (the
    first holds the padding sink), one batch has requests of all three size classes
    (16-, 32- and 64-slot blocks by prompt + max_tokens) and outputs are HF's. The layout
    has no prefix cache: a prompt run before finds no cached token, where the fixed-size
    paged layout would find its full blocks."""
    # HF ends these with EOS after 30, 44 and 40 tokens: every max_tokens >= 48 gives them
    stopping, ref_len = [PROMPTS[i] for i in (0, 12, 13)], 48
    classes = {16: ref_len, 32: 600, 64: 2100}  # max_tokens; every prompt < 20 tokens
    prompts = stopping * 3
    params = [SamplingParams(max_tokens=m, temperature=0.0)
              for m in classes.values() for _ in stopping]
    with Engine(model="smollm2", kv="paged", block_size="dynamic", kv_slots=4095,
                chunk_size=64, torch_threads=1) as eng:
        assert eng.stats().kv_total == (4096 // 64 - 1) * 64  # paged 16 would have 4080
        outs = eng.generate(prompts, params)
        for prompt, out in zip(prompts, outs, strict=True):
            ref, gaps = hf.greedy(hf.tokenizer.encode(prompt), ref_len)
            assert_matches(out.token_ids, ref, gaps, repr(prompt[:40]))
            assert out.finish_reason == "stop"
        assert len(hf.tokenizer.encode(PROMPTS[6])) > 32  # two full 16-slot blocks
        for _ in range(2):  # the second run finds nothing of the first cached
            eng.generate(PROMPTS[6], SamplingParams(max_tokens=1))
        stats = eng.stats()
    assert stats.invariant_error is None and stats.kv_used == 0
    assert stats.prefix_hit_tokens == 0


def test_contiguous_matches_hf(hf):
    with Engine(model="smollm2", kv="contiguous", chunk_size=64, torch_threads=2) as eng:
        stats = run_and_compare(hf, eng)
        assert stats.num_retractions == 0


def test_paged_preemption_by_recompute_matches_hf(hf):
    # 6 usable blocks of 16 (block 0 is the null block)
    with Engine(model="smollm2", kv="paged", block_size=16, kv_slots=112, chunk_size=128,
                overlap=True, schedule_conservativeness=0.0, torch_threads=2) as eng:
        stats = run_and_compare(hf, eng, NO_EARLY_STOP)
        assert stats.num_retractions > 0
