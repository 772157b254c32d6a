"""A draft model beside the target (`--speculative-algorithm draft`): plain decoding's
outputs on every KV layout, overlap on and off; every draft accepted when the draft is
the target itself; both pools' slots back after the requests; a vocabulary mismatch
refused at start-up."""

from __future__ import annotations

import pytest

from runtime.config.server import ServerConfig
from runtime.wire.sampling import SamplingParams
from runtime.worker.model_check import UnsupportedModel
from tests.speculative.serve import greedy_case, refused_at_start_up, serve
from tests.speculative.test_exact import CFG, K, repetitive_prompts

DRAFT = CFG.replace(speculative_algorithm="draft", speculative_draft_model="dummy:tiny",
                    speculative_num_draft_tokens=K, speculative_off_window=0)


@pytest.fixture(scope="module", name="greedy_case")
def greedy_case_fixture():
    return greedy_case(CFG, repetitive_prompts(5, (5, 17, 2)), (14, 9, 11))


@pytest.mark.parametrize("kv", ["token", "paged", "contiguous"])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_are_plain_decodings(greedy_case, kv, overlap):
    prompts, params, ref = greedy_case
    for draft in ("dummy:tiny", "dummy:tiny-draft"):
        cfg = DRAFT.replace(kv=kv, overlap=overlap, speculative_draft_model=draft)
        outs, sched, worker = serve(cfg, prompts, params)
        spec = sched.spec
        assert outs == ref, draft
        assert sched.kv.stats().used == 0, draft  # both pools: the same slots came back
        assert worker.drafter.pool.num_slots == worker.runner.kv_pool.num_slots
        if draft == "dummy:tiny":  # the target drafting for itself: nothing rejected
            assert spec.accepted == spec.drafted > 0
            # the prefill samples the first token, each verify step k + 1 (the last fewer)
            assert spec.verify_steps == sum(-(-(p.max_tokens - 1) // (K + 1)) for p in params)
        else:  # random weights of another shape: drafts are (almost) never the target's
            assert spec.verify_steps > 0 and spec.accepted < spec.drafted


def test_seeded_samples_are_plain_decodings():
    """Greedy drafts and the target's own seeded samples: every seed gives the very tokens
    of plain seeded sampling (some drafts kept, some not)."""
    prompts = repetitive_prompts(13, (7,)) * 12
    params = [SamplingParams(max_tokens=10, temperature=0.8, top_k=4, seed=s)
              for s in range(12)]
    cfg = CFG.replace(max_running=12)
    ref, _, _ = serve(cfg, prompts, params)
    assert len({tuple(o) for o in ref}) > 6
    outs, sched, _ = serve(DRAFT.replace(max_running=12), prompts, params)
    assert outs == ref
    assert 0 < sched.spec.accepted < sched.spec.drafted


def test_a_vocabulary_mismatch_is_refused_at_start_up():
    cfg = DRAFT.replace(speculative_draft_model="dummy:spec-draft")  # 8192 ids, not 1024
    want = r"^dummy:spec-draft: the draft model's vocabulary has 8192 ids, the target's " \
           r"\(dummy:tiny\) 1024$"
    refused_at_start_up(cfg, UnsupportedModel, want)


def test_the_draft_flags_go_together():
    with pytest.raises(ValueError, match="speculative_draft_model"):
        ServerConfig(speculative_algorithm="draft")
    with pytest.raises(ValueError, match="speculative_draft_model"):
        ServerConfig(speculative_draft_model="dummy:tiny")
