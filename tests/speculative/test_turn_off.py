"""A request whose drafts keep failing stops speculating: after `speculative_off_window`
drafting steps that kept too few drafts it decodes plainly, overlapped again, and its
output is still plain decoding's."""

from __future__ import annotations

from collections import deque

import pytest

from runtime.model_config import resolve_model
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.sampling import SamplingParams
from runtime.worker.worker import Worker
from tests.speculative.serve import serve, start
from tests.speculative.test_exact import CFG, K, contrarian, repetitive_prompts

WINDOW = 3
PROMPTS = repetitive_prompts(21, (6, 10, 3))
PARAMS = [SamplingParams(max_tokens=m, temperature=0.0) for m in (16, 12, 14)]


def run(worker: Worker, cfg, spec: Speculation | None) -> tuple[list[list[int]], object, int]:
    """Serve PROMPTS; also the most batches in flight once every request stopped
    speculating."""
    sched, outs = start(cfg, worker, PROMPTS, PARAMS, spec)
    in_flight: deque = deque()
    overlapped = 0
    while sched.has_work or in_flight:
        while sched.can_plan() and (plan := sched.plan()) is not None:
            in_flight.append(worker.launch(plan))
            if sched.spec.turned_off == len(PROMPTS):
                overlapped = max(overlapped, len(in_flight))
        sched.on_result(in_flight.popleft().result())
        for out in sched.take_outputs():
            outs[out.rid] += out.token_ids
    return [outs[f"r{i}"] for i in range(len(PROMPTS))], sched, overlapped


@pytest.fixture(scope="module")
def reference():
    ref, _, worker = serve(CFG, PROMPTS, PARAMS)
    return ref, worker


def test_rejected_drafts_turn_speculation_off(reference):
    ref, worker = reference
    by_rid = {f"r{i}": o for i, o in enumerate(ref)}
    spec = contrarian(by_rid)
    spec.off_window, spec.off_accept = WINDOW, 0.5
    outs, sched, overlapped = run(worker, CFG, spec)
    assert outs == ref
    assert spec.turned_off == len(PROMPTS)
    assert spec.verify_steps == WINDOW * len(PROMPTS) and spec.accepted == 0
    assert overlapped == 2  # back on the overlapped path
    assert sched.kv.stats().used == 0


def test_a_random_draft_model_is_turned_off(reference):
    ref, _ = reference
    cfg = CFG.replace(speculative_algorithm="draft", speculative_draft_model="dummy:tiny-draft",
                      speculative_num_draft_tokens=K, speculative_off_window=WINDOW)
    worker = Worker(cfg, resolve_model(cfg.model))
    outs, sched, overlapped = run(worker, cfg, None)
    assert outs == ref
    assert sched.spec.turned_off == len(PROMPTS) and overlapped == 2
    # a drafter on the device drafts behind the step in flight: when the window's last
    # result turns speculation off, one more verify step is already on its way
    assert sched.spec.chains
    assert sched.spec.verify_steps == (WINDOW + 1) * len(PROMPTS)


def test_accepted_drafts_keep_speculation_on(reference):
    ref, _ = reference
    cfg = CFG.replace(speculative_algorithm="draft", speculative_draft_model="dummy:tiny",
                      speculative_off_window=WINDOW)
    outs, sched, _ = serve(cfg, PROMPTS, PARAMS)
    assert outs == ref
    assert sched.spec.turned_off == 0 and sched.spec.accepted == sched.spec.drafted



@pytest.mark.parametrize("algo, extra", [("ngram", {}),
                                         ("draft", {"speculative_draft_model": "dummy:tiny"})])
def test_every_algorithm_takes_the_rule_from_the_config(algo, extra):
    cfg = CFG.replace(speculative_algorithm=algo, speculative_off_window=5,
                      speculative_off_accept=1.5, **extra)
    spec = Speculation.from_config(cfg)
    assert (spec.off_window, spec.off_accept) == (5, 1.5)
