"""A tiny random DeepSeek-V4 checkpoint served end to end on the CPU: 16 greedy tokens per
prompt equal transformers' `generate`, with prompts longer than the sliding window and than
several compression blocks, radix prefix-cache hits (the second pass reuses every prompt's
window rows, compressed entries and partial blocks), the paged mode under a pool so tight
that requests retract and recompute, the contiguous mode, and `--tp 2` (two gloo ranks,
each with half the heads and expert width and its own pool rows, entries and host tier)."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine, SamplingParams
from tests.e2e.greedy_prompts import greedy_tokens, shared_prefix_prompts
from tests.worker.dsv4_checkpoints import tiny_v4

NEW_TOKENS = 16
PARAMS = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def prompts() -> list[list[int]]:
    return shared_prefix_prompts(7, 256, 18, (2, 7, 13, 29))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[str, list[list[int]]]:
    """The checkpoint's folder and transformers' greedy tokens of each prompt."""
    folder = tmp_path_factory.mktemp("dsv4")
    hf = tiny_v4(folder)
    want = []
    with torch.no_grad():
        for p in prompts():
            out = hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)
            want.append(out[0, len(p) :].tolist())
    return str(folder), want


def generate(eng: Engine) -> list[list[int]]:
    return greedy_tokens(eng, prompts(), PARAMS)


def test_token_mode_with_overlap_and_prefix_hits(checkpoint):
    folder, want = checkpoint
    with Engine(model=folder, overlap=True, torch_threads=1) as eng:
        assert generate(eng) == want
        assert generate(eng) == want  # again, the prompts' state from the radix cache
        assert eng.stats().prefix_hit_tokens > 0


def test_paged_mode_retracts_and_recomputes(checkpoint):
    folder, want = checkpoint
    # 10 usable blocks of 8 slots for 4 requests of 36 to 63 tokens: some must retract
    with Engine(model=folder, kv="paged", block_size=8, kv_slots=88, chunk_size=16,
                schedule_conservativeness=0.0, torch_threads=1) as eng:
        assert generate(eng) == want
        assert eng.stats().num_retractions > 0


def test_contiguous_mode(checkpoint):
    folder, want = checkpoint
    with Engine(model=folder, kv="contiguous", torch_threads=1) as eng:
        assert generate(eng) == want


@pytest.mark.parametrize("options", [
    dict(kv="paged", block_size=8),
    # the first pass's prefixes go to the host, the second loads them back
    dict(host_kv_gib=0.05),
])  # fmt: skip
def test_tp2_with_overlap_prefix_hits_and_a_tight_pool(checkpoint, options):
    """Each rank keeps its own pool rows, entries, rings and host copies: transformers'
    tokens through retraction, prefix hits and (token layout) the host tier."""
    folder, want = checkpoint
    with Engine(model=folder, tp=2, overlap=True, kv_slots=88, chunk_size=16,
                torch_threads=1, **options) as eng:
        assert generate(eng) == want
        assert generate(eng) == want  # every rank's pool and entry pools hold the prefixes
        stats = eng.stats()
    assert stats.prefix_hit_tokens > 0 and stats.num_retractions > 0
    assert stats.invariant_error is None
    if "host_kv_gib" in options:
        assert stats.load_bytes > 0 and stats.host_hit_tokens > 0
