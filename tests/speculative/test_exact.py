"""Speculative decoding gives plain decoding's outputs: the same greedy tokens, the same
seeded samples, on every KV layout, with and without overlap, through retraction and
prefix hits; the KV of rejected drafts goes back to the pool and never into the cache.

The drafters: prompt lookup (`ngram`, on prompts that repeat themselves), the oracle
(replays the plain run: every draft accepted) and a contrarian one (drafts what the plain
run did not produce: every draft rejected, so every verify step gives back k slots).
"""

from __future__ import annotations

import pytest
import torch

from bench.speculative.oracle import OracleDrafter, oracle_speculation
from runtime.config.server import ServerConfig
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from tests.speculative.serve import greedy_case, retraction_case, serve
from tests.worker.in_process import run_to_end

CFG = ServerConfig(model="dummy:tiny", device="cpu", dtype="float32", kv_slots=1023,
                   max_running=8, chunk_size=64, torch_threads=1, log_level="warning")
K = 4


def repetitive_prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 1024, (n,), generator=gen).tolist() * 3 for n in lengths]


def contrarian(reference: dict[str, list[int]]) -> Speculation:
    """Drafts one more than each token the plain run produced: always rejected."""
    oracle = oracle_speculation(reference, K)

    def wrong(req) -> OracleDrafter:
        right = oracle.new_drafter(req)
        return OracleDrafter(right.prompt_len, [t + 1 for t in right.continuation])
    return Speculation(K, wrong)


def drafters(ref: list[list[int]]) -> dict[str, Speculation | None]:
    by_rid = {f"r{i}": o for i, o in enumerate(ref)}
    return {"ngram": None, "oracle": oracle_speculation(by_rid, K),
            "contrarian": contrarian(by_rid)}


@pytest.fixture(scope="module", name="greedy_case")
def greedy_case_fixture():
    return greedy_case(CFG, repetitive_prompts(5, (5, 17, 30, 2)), (24, 9, 40, 17))


@pytest.mark.parametrize("kv", ["token", "paged", "contiguous"])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_are_plain_decodings(greedy_case, kv, overlap):
    prompts, params, ref = greedy_case
    cfg = CFG.replace(kv=kv, overlap=overlap, speculative_algorithm="ngram",
                      speculative_num_draft_tokens=K)
    for name, spec in drafters(ref).items():
        outs, sched, _ = serve(cfg, prompts, params, spec)
        assert outs == ref, name
        assert sched.spec.verify_steps > 0, name
        assert sched.kv.stats().used == 0, name  # rejected drafts' slots came back
        if name == "oracle":  # every draft accepted: fewer steps than tokens
            assert sched.spec.accepted == sched.spec.drafted > 0
        if name == "contrarian":
            assert sched.spec.accepted == 0


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_greedy_outputs_survive_retraction(kv):
    """A pool too small for the batch retracts running requests (some mid-speculation)."""
    prompts, params = retraction_case()
    cfg = CFG.replace(kv=kv, kv_slots=191, schedule_conservativeness=0.0, overlap=True)
    ref, _, _ = serve(cfg, prompts, params)
    for name, spec in drafters(ref).items():
        outs, sched, _ = serve(cfg.replace(speculative_algorithm="ngram"), prompts, params,
                               spec)
        assert outs == ref, name
        assert sched.num_retractions > 0 and sched.spec.verify_steps > 0, name
        assert sched.kv.stats().used == 0, name


def test_the_cache_holds_only_accepted_tokens():
    """After every draft was rejected, a request continuing an earlier one hits its whole
    sequence in the radix cache and continues exactly as plain decoding does."""
    prompts = repetitive_prompts(9, (6, 11))
    params = [SamplingParams(max_tokens=20, temperature=0.0)] * 2
    ref, _, worker = serve(CFG, prompts, params)
    follow = [p + o for p, o in zip(prompts, ref)]
    want, _, _ = serve(CFG, follow, params, worker=worker)
    # the schedulers share the worker's KV pool: the cached run comes last
    outs, sched, _ = serve(CFG, prompts, params,
                           contrarian({f"r{i}": o for i, o in enumerate(ref)}), worker)
    assert outs == ref and sched.spec.verify_steps > 0
    sched.spec = None
    got: dict[str, list[int]] = {"f0": [], "f1": []}
    cached = {"f0": 0, "f1": 0}
    for i, prompt in enumerate(follow):
        sched.add(GenerateReq(f"f{i}", prompt, params[i]))
    run_to_end(sched, worker, got, cached)
    assert [got["f0"], got["f1"]] == want
    # every position but the last had its KV cached, none of a rejected draft
    assert cached == {"f0": len(follow[0]) - 1, "f1": len(follow[1]) - 1}


def test_prefix_hits_with_speculation():
    """Requests sharing a prompt, two at a time: the later ones start from cached KV."""
    prompts = repetitive_prompts(11, (9,)) * 4
    params = [SamplingParams(max_tokens=16, temperature=0.0)] * 4
    cfg = CFG.replace(max_running=2)
    ref, _, _ = serve(cfg, prompts, params)
    outs, sched, _ = serve(cfg.replace(speculative_algorithm="ngram"), prompts, params)
    assert outs == ref and sched.spec.verify_steps > 0
    assert sched.kv.stats().prefix_hit_tokens > 0


def test_seeded_samples_are_plain_decodings_for_every_seed():
    """With per-position seeded noise, keeping the target's own samples gives the very
    tokens of plain seeded sampling, so the output distribution is the target's."""
    prompts = repetitive_prompts(13, (7,)) * 24
    params = [SamplingParams(max_tokens=12, temperature=0.8, top_k=8, seed=s)
              for s in range(24)]
    ref, _, _ = serve(CFG.replace(max_running=24), prompts, params)
    assert len({tuple(o) for o in ref}) > 12  # the seeds really sample different tokens
    greedy, _, _ = serve(CFG, prompts[:1], [SamplingParams(max_tokens=12, temperature=0.0)])
    spec = oracle_speculation({f"r{i}": greedy[0] for i in range(24)}, K)
    outs, sched, _ = serve(CFG.replace(max_running=24), prompts, params, spec)
    assert outs == ref
    assert 0 < sched.spec.accepted < sched.spec.drafted  # some drafts kept, some not


def test_streaming_sends_each_verify_steps_tokens_at_once():
    prompts = repetitive_prompts(5, (12,))
    params = [SamplingParams(max_tokens=21, temperature=0.0)]
    ref, _, worker = serve(CFG, prompts, params)
    _, sched, _ = serve(CFG, [], [], worker=worker)
    sched.spec = oracle_speculation({"r0": ref[0]}, K)
    sched.add(GenerateReq("r0", prompts[0], params[0]))
    chunks = []
    while sched.has_work:
        plan = sched.plan()
        sched.on_result(worker.launch(plan).result())
        chunks += [out.token_ids for out in sched.take_outputs() if out.token_ids]
    assert [t for c in chunks for t in c] == ref[0]
    # the first token comes from the prefill, then K + 1 per verify step
    assert [len(c) for c in chunks] == [1, 5, 5, 5, 5]
