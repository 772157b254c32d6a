"""Verify steps chained behind the step in flight (a drafter on the device, with overlap):
the next verify step is planned before the previous result is known, as if every draft
were kept, and the worker moves it back by the drafts rejected. Outputs stay plain
decoding's for every number of drafts kept, a stop token or an abort inside a chained
pair ends the request with every slot back, and two batches stay in flight.

The drafter replays the plain run with some tokens corrupted (`DeviceOracle` over a
table the test writes), so each verify step keeps a known, varying number of drafts."""

from __future__ import annotations

from collections import deque

import pytest

from bench.speculative.device_oracle import DeviceOracle, device_oracle_speculation
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.worker import Worker
from tests.speculative.serve import serve
from tests.speculative.test_exact import CFG, K, repetitive_prompts

PROMPTS = repetitive_prompts(31, (5, 17, 30, 2))
MAX_TOKENS = (24, 9, 40, 17)


@pytest.fixture(scope="module")
def reference():
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in MAX_TOKENS]
    ref, _, worker = serve(CFG.replace(kv_slots=1023), PROMPTS, params)
    return ref, worker


def corrupted(prompt: list[int], out: list[int], every: int | None) -> list[int]:
    """`prompt + out` with every `every`-th output token drafted wrong (None: none)."""
    return prompt + [t + 1 if every and i % every == 0 else t for i, t in enumerate(out)]


def run(worker: Worker, cfg, params, sequences, abort_after: int | None = None,
        stops: list[int] | None = None, prompts: list[list[int]] = PROMPTS):
    """Serve `prompts` with the oracle drafting `sequences[i]` for request i in the worker
    (request i stopping at token `stops[i]`); with `abort_after`, abort r0 once that many
    steps were planned. Returns the outputs, the scheduler, the steps planned behind a
    verify step in flight and the most batches in flight."""
    sched = build_scheduler(cfg, worker.ready_message(), worker.runner.max_context)
    sched.spec = device_oracle_speculation(K)
    outs = {f"r{i}": [] for i in range(len(prompts))}
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        sched.add(GenerateReq(f"r{i}", prompt, p, [stops[i]] if stops else []))
    oracle = DeviceOracle(worker.max_rows, worker.runner.max_context, worker.device)
    worker.drafter = oracle
    in_flight, chained, most, planned = deque(), 0, 0, 0
    try:
        while sched.has_work or in_flight:
            while sched.can_plan() and (plan := sched.plan()) is not None:
                rid = {r.row: r.rid for r in sched.running}
                for init in plan.inits:
                    oracle.bind(init.row, sequences[int(rid[init.row][1:])])
                chained += sum(b > 0 for b in plan.chain_back)
                in_flight.append(worker.launch(plan))
                most, planned = max(most, len(in_flight)), planned + 1
                if planned == abort_after:
                    sched.abort("r0")
            sched.on_result(in_flight.popleft().result())
            if not sched.in_flight:
                sched.check_invariants()
            for out in sched.take_outputs():
                outs[out.rid] += out.token_ids
    finally:
        worker.drafter = None
    return [outs[f"r{i}"] for i in range(len(prompts))], sched, chained, most


@pytest.mark.parametrize("kv", ["token", "paged"])
@pytest.mark.parametrize("every", [1, 2, 3, None])
def test_chained_steps_give_plain_decodings_for_any_acceptance(reference, kv, every):
    ref, _ = reference
    cfg = CFG.replace(kv=kv, overlap=True, speculative_num_draft_tokens=K)
    worker = Worker(cfg.replace(speculative_algorithm="ngram"), resolve_model(cfg.model))
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in MAX_TOKENS]
    seqs = [corrupted(p, o, every) for p, o in zip(PROMPTS, ref)]
    outs, sched, chained, most = run(worker, cfg, params, seqs)
    assert outs == ref
    spec = sched.spec
    assert chained > 0 and most == 2
    if every is None:
        assert spec.accepted == spec.drafted
    elif every == 1:
        assert spec.accepted == 0
    else:
        assert 0 < spec.accepted < spec.drafted
    assert sched.kv.stats().used == 0


def test_a_stop_token_inside_a_chained_pair_ends_the_request(reference):
    """Every draft kept, so the step after the one producing the stop token is already in
    flight: the request ends at the stop token and every slot comes back."""
    ref, _ = reference
    cfg = CFG.replace(overlap=True, speculative_num_draft_tokens=K)
    worker = Worker(cfg.replace(speculative_algorithm="ngram"), resolve_model(cfg.model))
    stops = [o[len(o) // 2] for o in ref]
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in MAX_TOKENS]
    seqs = [p + o for p, o in zip(PROMPTS, ref)]
    outs, sched, chained, _ = run(worker, cfg, params, seqs, stops=stops)
    assert outs == [o[:o.index(s) + 1] for o, s in zip(ref, stops)]
    assert chained > 0
    assert sched.kv.stats().used == 0


@pytest.mark.parametrize("after", [2, 3, 4])
def test_an_abort_between_chained_steps_gives_every_slot_back(reference, after):
    ref, _ = reference
    cfg = CFG.replace(overlap=True, speculative_num_draft_tokens=K)
    worker = Worker(cfg.replace(speculative_algorithm="ngram"), resolve_model(cfg.model))
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in MAX_TOKENS]
    seqs = [corrupted(p, o, 3) for p, o in zip(PROMPTS, ref)]
    outs, sched, chained, _ = run(worker, cfg, params, seqs, abort_after=after)
    assert outs[1:] == ref[1:]
    assert outs[0] == ref[0][:len(outs[0])] and len(outs[0]) < len(ref[0])
    assert sched.kv.stats().used == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["token", "paged"])
def test_chained_steps_on_cuda_give_plain_decodings(kv):
    """The moved positions, lengths and page lists built by the CUDA kernels (fp32:
    outputs exact), every third draft wrong."""
    cfg = CFG.replace(device="cuda", kv=kv, overlap=True, speculative_num_draft_tokens=K)
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in MAX_TOKENS]
    worker = Worker(cfg.replace(speculative_algorithm="ngram"), resolve_model(cfg.model))
    ref, _, _ = serve(cfg, PROMPTS, params, worker=worker)  # plain decoding
    seqs = [corrupted(p, o, 3) for p, o in zip(PROMPTS, ref)]
    outs, sched, chained, most = run(worker, cfg, params, seqs)
    assert outs == ref and chained > 0 and most == 2
    assert 0 < sched.spec.accepted < sched.spec.drafted
    assert sched.kv.stats().used == 0
