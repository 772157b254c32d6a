"""Tensor parallelism on the CPU (gloo): SmolLM2 split over 3 worker processes gives the
greedy tokens of one worker, and of HF transformers.

SmolLM2 has 9 query heads and 3 KV heads, so it splits by 3, not by 2; `--tp 2` must fail
at start-up with a message that says so.
"""

from __future__ import annotations

import re

import pytest

from runtime import Engine, SamplingParams
from runtime.worker.model_check import UnsupportedModel
from tests.e2e.hf_reference import PROMPTS, assert_matches, shared_reference
from tests.e2e.test_engine_api import wait_idle
from tests.near_tie import near_tie_failures_by_logprobs

MAX_TOKENS = 16
SUBSET = [PROMPTS[i] for i in (0, 1, 3, 6, 7, 13, 15)]  # shared prefixes, a long prompt


def generate(tp: int, **options) -> tuple[list[list[int]], object]:
    with Engine(model="smollm2", tp=tp, chunk_size=64, torch_threads=1, **options) as eng:
        outs = eng.generate(SUBSET, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
        return [o.token_ids for o in outs], eng.stats()


@pytest.mark.parametrize("overlap", [True, False])
def test_tp3_equals_tp1_and_hf(overlap):
    split, stats = generate(3, overlap=overlap)
    whole, _ = generate(1, overlap=overlap)
    assert split == whole  # token for token
    assert stats.invariant_error is None and stats.kv_used == 0
    hf = shared_reference()
    for prompt, ids in zip(SUBSET, split, strict=True):
        ref, gaps = hf.greedy(hf.tokenizer.encode(prompt), MAX_TOKENS)
        assert_matches(ids, ref, gaps, repr(prompt[:40]))


def test_tp3_regexes_are_compiled_by_every_rank_and_evicted_across_processes():
    """Each rank compiles a new regex and reports it; the scheduler admits the request
    only once all three did. A cache of one regex evicts on every change of regex."""
    date, number = r"\d{4}-\d{2}-\d{2}", r"[1-9]\d{0,3}"
    with Engine(model="smollm2", tp=3, chunk_size=64, torch_threads=1,
                grammar_cache_size=1) as eng:
        for prompt, regex in [("Today's date is ", date), ("A number: ", number),
                              ("Tomorrow's date is ", date)]:
            outs = eng.generate([prompt, prompt + "an "],
                                SamplingParams(max_tokens=16, temperature=0.0, regex=regex))
            for out in outs:
                assert out.finish_reason == "stop" and re.fullmatch(regex, out.text), out
        stats = wait_idle(eng)  # a batch planned past the EOS may still be in flight
    assert stats.invariant_error is None and stats.kv_used == 0 and stats.waiting == 0


def test_tp_that_does_not_divide_the_heads_fails_clearly():
    """Refused before any process starts, naming the config and the heads."""
    with pytest.raises(UnsupportedModel,
                       match=r"config.json: --tp 2 does not divide attention heads \(9\)"):
        Engine(model="smollm2", tp=2, torch_threads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["dummy:tiny", "dummy:deepseek-v4-tiny"])
def test_tp2_on_two_gpus_equals_tp1(model):
    """NCCL, CUDA graphs with the collectives captured: `model` in fp32 at TP 2 gives TP 1's
    greedy tokens (the split matmuls sum in another order: only a near-tie may flip)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 1024, (n,), generator=gen).tolist() for n in (5, 40, 77, 130)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, top_logprobs=2)
    runs = []
    for tp in (1, 2):
        with Engine(model=model, device="cuda", dtype="float32", tp=tp) as eng:
            runs.append(eng.generate(prompts, params))
    assert near_tie_failures_by_logprobs([o.token_ids for o in runs[1]], runs[0]) == []
