"""n-gram lookup in the worker (`NgramOnDevice`, with overlap): its drafts are the host
drafter's wherever that one finds a match, its verify steps chain behind the step in
flight, and outputs stay plain decoding's, prefix hits included. Without overlap the
host drafts as before."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from runtime.model_config import resolve_model
from runtime.scheduler.speculative.ngram import NgramDrafter
from runtime.scheduler.speculative.speculation import ModelDrafts
from runtime.wire.sampling import SamplingParams
from runtime.worker.speculative.ngram_device import NgramOnDevice, ngram_drafts
from runtime.worker.worker import Worker
from tests.speculative.serve import greedy_case, serve, start, step_drafts
from tests.speculative.test_exact import CFG, K, repetitive_prompts

NGRAM = CFG.replace(speculative_algorithm="ngram", speculative_num_draft_tokens=K)


def sequences(seed: int, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` sequences [R, length] of a few repeated random pieces over a small vocabulary
    (so suffixes recur), each of a random true length (its last position [R]); the ids
    past it are random too, and must be ignored."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(rows):
        pieces = [torch.randint(0, 6, (int(n),), generator=gen)
                  for n in torch.randint(1, 7, (4,), generator=gen)]
        order = torch.randint(0, 4, (length,), generator=gen).tolist()
        seqs.append(torch.cat([pieces[i] for i in order])[:length])
    last = torch.randint(0, length, (rows,), generator=gen)  # [R] (some too short to match)
    return torch.stack(seqs), last


@pytest.mark.parametrize("min_n, max_n", [(1, 1), (1, 3), (2, 4), (3, 5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_drafts_are_the_host_drafters_where_it_matches(seed, min_n, max_n):
    seq, last = sequences(seed, 64, 40)
    k = 5
    got = ngram_drafts(seq, last, k, min_n, max_n).tolist()  # [R, k]
    matched = 0
    for r in range(len(seq)):
        tokens = seq[r, :int(last[r]) + 1].tolist()
        want = NgramDrafter(min_n, max_n).propose(tokens, k)
        if want:
            matched += 1
            assert got[r][:len(want)] == want, (tokens, want, got[r])
    assert matched > len(seq) // 4  # the rule was exercised


def test_the_lookup_reads_nothing_on_the_host():
    """The device's part of a verify step's lookup (its sequences gathered through the
    page table, the matcher, the drafts placed) under FakeTensorMode: `.item()`,
    `.tolist()`, `bool()` of a tensor and ops whose output shape depends on values raise
    there."""
    cfg = NGRAM.replace(overlap=True)
    worker = Worker(cfg, resolve_model(cfg.model))
    params = [SamplingParams(max_tokens=8, temperature=0.0)] * 2
    sched, _ = start(cfg, worker, repetitive_prompts(5, (5, 9)), params)
    while not (plan := sched.plan()).draft_lens:  # up to the first verify step
        sched.on_result(worker.launch(plan).result())
    fb, _ = worker.builder.build(plan)
    for read, caught in ((lambda t: t.sum().item(), DataDependentOutputException),
                         (lambda t: t.nonzero(), DynamicOutputShapeException)):
        with pytest.raises(caught), FakeTensorMode(allow_non_fake_inputs=True):
            read(fb.positions)  # the guard at work
    staged = worker.drafter.stage(plan)  # the host's part: index arrays, uploaded
    with FakeTensorMode(allow_non_fake_inputs=True):
        drafts = worker.drafter.draft(*staged, fb, worker.builder)
    assert drafts.shape == (sum(plan.draft_lens),) and drafts.dtype == torch.int64


@pytest.fixture(scope="module", name="greedy_case")
def greedy_case_fixture():
    return greedy_case(CFG, repetitive_prompts(5, (5, 17, 30, 2)), (24, 9, 40, 17))


def counting_plans(worker: Worker, monkeypatch) -> list:
    """The plans `worker` launches from now on, in order."""
    plans, launch = [], worker.launch

    def spy(plan):
        plans.append(plan)
        return launch(plan)
    monkeypatch.setattr(worker, "launch", spy)
    return plans


def check_chained(cfg, case, monkeypatch, plain_on_worker: bool = False) -> None:
    """`cfg` (n-gram with overlap) drafts in its worker and chains verify steps, with plain
    decoding's outputs (`case`'s, or with `plain_on_worker` those of its own worker run
    plainly) and every slot back."""
    prompts, params, ref = case
    worker = Worker(cfg, resolve_model(cfg.model))
    assert isinstance(worker.drafter, NgramOnDevice)
    if plain_on_worker:
        ref = serve(cfg.replace(speculative_algorithm="none"), prompts, params, worker=worker)[0]
    plans = counting_plans(worker, monkeypatch)
    outs, sched, _ = serve(cfg, prompts, params, worker=worker)
    assert outs == ref
    assert sched.spec.chains and isinstance(sched.spec.new_drafter(None), ModelDrafts)
    assert 0 < sched.spec.accepted < sched.spec.drafted
    assert sum(b > 0 for p in plans for b in p.chain_back) > 0  # steps chained
    assert sched.kv.stats().used == 0  # every slot came back


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_overlapped_ngram_drafts_on_the_device_and_chains(greedy_case, kv, monkeypatch):
    check_chained(NGRAM.replace(kv=kv, overlap=True), greedy_case, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["token", "paged"])
def test_overlapped_ngram_on_cuda_gives_plain_decodings(greedy_case, kv, monkeypatch):
    """The lookup's gathers and the chained steps on CUDA (fp32: outputs exact)."""
    check_chained(NGRAM.replace(device="cuda", kv=kv, overlap=True), greedy_case, monkeypatch,
                  plain_on_worker=True)


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_without_overlap_the_host_drafts(greedy_case, kv, monkeypatch):
    prompts, params, ref = greedy_case
    cfg = NGRAM.replace(kv=kv, overlap=False)
    worker = Worker(cfg, resolve_model(cfg.model))
    assert worker.drafter is None
    plans = counting_plans(worker, monkeypatch)
    outs, sched, _ = serve(cfg, prompts, params, worker=worker)
    assert outs == ref
    assert not sched.spec.chains and sched.spec.accepted > 0
    assert not any(p.chain_back for p in plans)
    assert sched.kv.stats().used == 0


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_drafts_look_up_a_prefix_shared_from_the_cache(kv):
    """The second request continues the first one's sequence, which it finds in the cache
    (all but its last token): its first drafts follow occurrences in that cached part,
    which the device reads by slot, so they are the host drafter's over the whole
    sequence."""
    cfg = NGRAM.replace(kv=kv, overlap=True, max_running=1)
    plain = cfg.replace(speculative_algorithm="none")
    head = repetitive_prompts(17, (12,))[0]  # 36 tokens, repeating
    first = serve(plain, [head], [SamplingParams(max_tokens=24, temperature=0.0)])[0][0]
    prompts = [head, head + first[:12]]
    params = [SamplingParams(max_tokens=24, temperature=0.0)] * 2
    ref, _, _ = serve(plain, prompts, params)
    outs, sched, _ = serve(cfg, prompts, params)
    assert outs == ref and sched.spec.accepted > 0
    assert sched.kv.stats().prefix_hit_tokens >= 32
    worker = Worker(cfg, resolve_model(cfg.model))
    matched = 0
    for tokens, drafts in step_drafts(cfg, worker, prompts, params):
        want = NgramDrafter(cfg.speculative_ngram_min,
                            cfg.speculative_ngram_max).propose(tokens, len(drafts))
        if want:
            matched += 1
            assert drafts[:len(want)] == want, (tokens, want, drafts)
    assert matched > 0
