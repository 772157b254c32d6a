"""`dummy:deepseek-tiny` (MLA over a latent pool, MoE) served end to end on the CPU: the
greedy tokens of every KV mode equal the model's own step-by-step greedy decoding, with
radix prefix-cache hits, retraction under a tight pool, overlap scheduling and TP 2."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine, SamplingParams
from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner
from tests.e2e.greedy_prompts import greedy_tokens, shared_prefix_prompts
from tests.near_tie import near_tie_failures
from tests.worker.batching import Chunk, make_batch

MODEL = "dummy:deepseek-tiny"
MAX_TOKENS = 8
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def prompts() -> list[list[int]]:
    return shared_prefix_prompts(5, 1024, 20, (3, 9, 14, 30))


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Greedy tokens of each prompt alone, prefill then one decode step at a time, and the
    `[V]` logits each token was chosen from."""
    runner = ModelRunner(resolve_model(MODEL), "cpu", torch.float32, kv_slots=128, max_rows=1)
    out, steps = [], []
    for prompt in prompts():
        ids, done, seen = list(prompt), 0, []
        for _ in range(MAX_TOKENS):
            logits = runner.forward(make_batch([Chunk(0, ids[done:])], [done], 1))  # [1, V]
            done = len(ids)
            ids.append(int(logits[0].argmax()))
            seen.append(logits[0])
        out.append(ids[len(prompt) :])
        steps.append(seen)
    return out, steps


@pytest.fixture(scope="module")
def expected(reference) -> list[list[int]]:
    return reference[0]


def generate(eng: Engine) -> list[list[int]]:
    return greedy_tokens(eng, prompts(), PARAMS)


def test_token_mode_with_overlap_and_prefix_hits(expected):
    with Engine(model=MODEL, overlap=True, torch_threads=1) as eng:
        assert generate(eng) == expected
        assert generate(eng) == expected  # again, the prompts' KV from the radix cache
        assert eng.stats().prefix_hit_tokens > 0


def test_paged_mode_retracts_and_recomputes(expected):
    # 9 usable blocks of 8 slots for 4 requests of 31 to 58 tokens: some must retract
    with Engine(model=MODEL, kv="paged", block_size=8, kv_slots=80, chunk_size=32,
                schedule_conservativeness=0.0, torch_threads=1) as eng:
        assert generate(eng) == expected
        assert eng.stats().num_retractions > 0


def test_contiguous_mode(expected):
    with Engine(model=MODEL, kv="contiguous", torch_threads=1) as eng:
        assert generate(eng) == expected


def test_tp2_on_the_cpu(reference):
    """Two gloo ranks, each with half the heads and half of every expert's width: the
    partial sums add in another order, so outputs may differ only from a near-tie on."""
    with Engine(model=MODEL, tp=2, torch_threads=1) as eng:
        got = generate(eng)
    assert near_tie_failures(got, *reference) == []
