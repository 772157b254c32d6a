"""Retraction keeps seeded samples and penalties: served outputs under a KV pool too small
for the batch (requests retracted and recomputed) equal those of a pool that holds it all.

A seeded request's noise is a hash of (seed, position, token), and its penalties count the
tokens it produced, so a retracted request must come back with its sampler row rebuilt
from its outputs (counts, prompt mask) and sample each later position exactly as it
would have. On the CPU each row's arithmetic does not depend on its batch, so the two
runs agree token for token (`dummy:tiny`, float32).
"""

from __future__ import annotations

import pytest
import torch

from runtime import Engine, SamplingParams

N, MAX_TOKENS = 16, 32
OPTIONS = dict(model="dummy:tiny", device="cpu", dtype="float32", max_running=N,
               chunk_size=64, torch_threads=1, log_level="warning")


def requests() -> tuple[list[list[int]], list[SamplingParams]]:
    """Seeded sampling (top-k, top-p), greedy with every penalty, and both at once."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 1024, (int(k),), generator=gen).tolist()
               for k in torch.randint(4, 40, (N,), generator=gen)]
    kinds = [dict(temperature=0.9, top_p=0.95, top_k=200),
             dict(temperature=0.0, frequency_penalty=0.6, presence_penalty=0.4,
                  repetition_penalty=1.3),
             dict(temperature=0.7, frequency_penalty=0.5, repetition_penalty=1.2)]
    params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, seed=100 + i,
                             **kinds[i % 3]) for i in range(N)]
    return prompts, params


def serve(**options) -> tuple[list[list[int]], int]:
    """The requests' output ids and the number of retractions."""
    prompts, params = requests()
    with Engine(**OPTIONS, **options) as eng:
        outs = eng.generate(prompts, params)
        stats = eng.stats()
    assert stats.invariant_error is None and stats.kv_used == 0
    return [o.token_ids for o in outs], stats.num_retractions


@pytest.fixture(scope="module")
def whole_pool() -> list[list[int]]:
    outs, retractions = serve(kv_slots=4095)
    assert retractions == 0
    return outs


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_retracted_requests_keep_their_seeded_samples_and_penalties(whole_pool, kv):
    outs, retractions = serve(kv=kv, kv_slots=255, schedule_conservativeness=0.0)
    assert retractions > 0  # the pool really was too small for the batch
    assert outs == whole_pool
