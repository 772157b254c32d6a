"""The draft model's KV stays complete without a forward of its own per verify step: a
verify step costs the draft its k draft steps, and the last draft's KV, owed when every
draft was accepted, is written by the request's next step or kept out of the prefix
cache.

The draft is the target itself, so every draft is accepted exactly when the draft reads
the same KV as the target; its pool starts filled with large noise, so a position whose
draft KV was never written turns the draft's tokens away from the target's.
"""

from __future__ import annotations

import pytest
import torch

from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.kv_pool import KVPool
from runtime.worker.worker import Worker
from tests.speculative.serve import retraction_case, serve
from tests.speculative.test_draft_model import DRAFT
from tests.speculative.test_exact import CFG, K, repetitive_prompts
from tests.worker.in_process import run_to_end

SELF = DRAFT.replace(speculative_draft_model=CFG.model)  # the target drafting for itself
PROMPTS = repetitive_prompts(3, (2, 20, 6))  # 6, 60 and 18 tokens
# the prefill samples one token, then K + 1 per verify step: 2, 4 and 3 full verify steps;
# the last draft lands at positions 15, 79 (the last of a page of 16) and 32
PARAMS = [SamplingParams(max_tokens=1 + n * (K + 1), temperature=0.0) for n in (2, 4, 3)]


def noisy_worker(cfg) -> Worker:
    """A worker whose draft pool holds large noise where nothing was written."""
    worker = Worker(cfg, resolve_model(cfg.model))
    fill_with_noise(worker.drafter.pool)
    return worker


def fill_with_noise(pool: KVPool) -> None:
    gen = torch.Generator().manual_seed(0)
    for layer in pool.k + pool.v:
        layer.copy_(30 * torch.randn(layer.shape, generator=gen))


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return serve(CFG, PROMPTS, PARAMS)[0]


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_every_verify_step_accepts_every_draft(reference, kv):
    """Several verify steps a request, each yielding k + 1 tokens to the end."""
    cfg = SELF.replace(kv=kv)
    outs, sched, _ = serve(cfg, PROMPTS, PARAMS, worker=noisy_worker(cfg))
    assert outs == reference
    assert sched.spec.verify_steps == 2 + 4 + 3
    assert sched.spec.accepted == sched.spec.drafted == K * (2 + 4 + 3)
    assert sched.kv.stats().used == 0


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_a_verify_step_costs_the_draft_k_forwards(kv):
    """k draft steps for verify requests, one mirror forward for the other requests of a
    step (none when it has none)."""
    cfg = SELF.replace(kv=kv)
    worker = noisy_worker(cfg)
    forwards = []
    worker.drafter.model.register_forward_hook(lambda *_: forwards.append(1))
    outs = {f"r{i}": [] for i in range(len(PROMPTS))}
    _, sched, _ = serve(cfg, [], [], worker=worker)
    for i, (prompt, p) in enumerate(zip(PROMPTS, PARAMS)):
        sched.add(GenerateReq(f"r{i}", prompt, p))
    while sched.has_work:
        plan = sched.plan()
        forwards.clear()
        sched.on_result(worker.launch(plan).result())
        for out in sched.take_outputs():
            outs[out.rid] += out.token_ids
        drafts = max(plan.draft_lens, default=0)
        mirrored = not plan.draft_lens or 0 in plan.draft_lens
        assert len(forwards) == drafts + mirrored, plan
    assert sched.spec.accepted == sched.spec.drafted == K * (2 + 4 + 3)


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_a_request_ending_on_an_accepted_draft_caches_no_unwritten_kv(reference, kv):
    """A request's last verify step accepts every draft, so it ends owing its last
    draft's draft KV: that position stays out of the cache, and a request continuing it
    hits the rest and drafts from complete KV."""
    cfg = SELF.replace(kv=kv, max_running=1)
    worker = noisy_worker(cfg)
    outs, sched, _ = serve(cfg, PROMPTS, PARAMS, worker=worker)
    assert outs == reference
    follow = [p + o for p, o in zip(PROMPTS, outs)]
    want = serve(CFG, follow, PARAMS)[0]
    got, cached = continue_on(sched, worker, follow)
    assert got == want
    assert sched.spec.accepted == sched.spec.drafted
    # all but the last known token and the owed position before it (whole pages)
    assert cached == [(len(f) - 2) // cfg.kv_mode.page_size * cfg.kv_mode.page_size
                      for f in follow]


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_a_request_that_stops_speculating_pays_its_debt(reference, kv):
    """Its drafts all accepted, a request stops speculating (a rule no step meets): the
    mirror of its next plain step writes the owed draft KV, so its whole sequence is
    cached with complete draft KV. One step in flight: with overlap a second verify step
    would be planned behind the first before its result turns speculation off."""
    cfg = SELF.replace(kv=kv, max_running=1, speculative_off_window=1,
                       speculative_off_accept=K + 1, overlap=False)
    worker = noisy_worker(cfg)
    outs, sched, _ = serve(cfg, PROMPTS, PARAMS, worker=worker)
    assert outs == reference
    assert sched.spec.turned_off == len(PROMPTS) == sched.spec.verify_steps
    assert sched.spec.accepted == sched.spec.drafted
    follow = [p + o for p, o in zip(PROMPTS, outs)]
    want = serve(CFG, follow, PARAMS)[0]
    sched.spec.off_window = 0  # the continuations keep speculating
    got, cached = continue_on(sched, worker, follow)
    assert got == want
    assert sched.spec.accepted == sched.spec.drafted > K * len(PROMPTS)
    # all but the last known token (whole pages)
    assert cached == [(len(f) - 1) // cfg.kv_mode.page_size * cfg.kv_mode.page_size
                      for f in follow]


def continue_on(sched, worker: Worker, prompts: list[list[int]],
                ) -> tuple[list[list[int]], list[int]]:
    """Serve `prompts` (with PARAMS) on a scheduler that served others: their outputs and
    cached prompt tokens."""
    rids = [f"c{i}" for i in range(len(prompts))]
    outs, cached = {r: [] for r in rids}, dict.fromkeys(rids, 0)
    for rid, prompt, p in zip(rids, prompts, PARAMS):
        sched.add(GenerateReq(rid, prompt, p))
    run_to_end(sched, worker, outs, cached)
    return [outs[r] for r in rids], [cached[r] for r in rids]


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_retraction_keeps_the_draft_kv_complete(kv):
    """A pool too small for the batch retracts requests, some owing draft KV; those
    re-admitted draft from complete KV again."""
    prompts, params = retraction_case()
    base = CFG.replace(kv=kv, kv_slots=191, schedule_conservativeness=0.0, overlap=True)
    ref = serve(base, prompts, params)[0]
    cfg = SELF.replace(kv=kv, kv_slots=191, schedule_conservativeness=0.0, overlap=True)
    outs, sched, _ = serve(cfg, prompts, params, worker=noisy_worker(cfg))
    assert outs == ref
    assert sched.num_retractions > 0
    assert sched.spec.accepted == sched.spec.drafted > 0
    assert sched.kv.stats().used == 0
