"""A verify step (speculative decoding: a request's last token and its drafts) is built as a
decode batch of one row a token, each over its request's KV up to itself, and gives the
logits the same step built as an extend gives (`BatchBuilder`)."""

from __future__ import annotations

import msgspec
import pytest
import torch

from runtime.model_config import resolve_model
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder
from runtime.worker.model_runner import EAGER_DECODE_ROWS, ModelRunner
from runtime.worker.worker import Worker
from tests.speculative.serve import greedy_case, serve
from tests.speculative.test_exact import CFG, K, repetitive_prompts

# three requests: prompt lengths, then their verify step: request 0 decodes plainly,
# request 1 verifies 4 drafts (positions 30..34 cross the page at 32), request 2 two
# drafts (14..16 cross the page at 16)
PROMPTS = (20, 30, 14)
DRAFTS = (0, 4, 2)
ROWS = (0, 1, 2)


class Pages:
    """Consecutive pages for each request, as a scheduler would hand them out."""

    def __init__(self, page_size: int) -> None:
        self.page_size, self.next, self.held = page_size, 1, {r: 0 for r in ROWS}

    def start(self, row: int, end: int) -> list[int]:
        """The pages positions up to `end` start beyond those `row` holds."""
        need = -(-end // self.page_size) - self.held[row]
        self.held[row] += need
        self.next += need
        return list(range(self.next - need, self.next))


def plans(page_size: int, seed: int = 0) -> tuple[BatchPlan, BatchPlan]:
    """(the prompts' prefill, the verify step after it), with explicit ids throughout."""
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, 1024, (n + 1 + d,), generator=gen).tolist()
           for n, d in zip(PROMPTS, DRAFTS)]
    pages = Pages(page_size)
    prefill = BatchPlan(batch_id=0, rows=list(ROWS), prefix_lens=[0] * 3,
                        extend_lens=list(PROMPTS),
                        input_ids=[t for i, n in zip(ids, PROMPTS) for t in i[:n]],
                        new_pages=[p for r, n in zip(ROWS, PROMPTS) for p in pages.start(r, n)],
                        sample=[True] * 3)
    ext = [1 + d for d in DRAFTS]
    verify = BatchPlan(batch_id=1, rows=list(ROWS), prefix_lens=list(PROMPTS), extend_lens=ext,
                       input_ids=[t for i, n in zip(ids, PROMPTS) for t in i[n:]],
                       new_pages=[p for r, n, e in zip(ROWS, PROMPTS, ext)
                                  for p in pages.start(r, n + e)],
                       sample=[True] * 3, draft_lens=list(DRAFTS))
    return prefill, verify


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(resolve_model("dummy:tiny"), "cpu", torch.float32, kv_slots=512,
                       max_rows=4, attention_backend="torch")


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_verify_step_is_a_decode_batch_with_the_extend_batchs_logits(runner, page_size):
    builder = BatchBuilder(4, 128, torch.device("cpu"), page_size, max_decode_rows=256)
    prefill, verify = plans(page_size)
    runner.forward(builder.build(prefill)[0])
    fb, inputs = builder.build(verify)
    tokens = sum(verify.extend_lens)  # 9
    assert fb.is_decode and fb.batch_size == fb.num_tokens == tokens
    assert fb.positions.tolist() == [20, 30, 31, 32, 33, 34, 14, 15, 16]
    assert fb.seq_lens_cpu == [p + 1 for p in fb.positions.tolist()]
    assert fb.sample_idx.tolist() == list(range(tokens))
    got = runner.forward(fb)  # [9, V]
    builder.max_decode_rows = 0  # the same step as an extend: it rewrites the same K/V
    ext_fb, ext_inputs = builder.build(verify)
    assert not ext_fb.is_decode and ext_fb.batch_size == 3
    assert torch.equal(ext_fb.out_slots, fb.out_slots)
    assert ext_inputs.rows.tolist() == inputs.rows.tolist() == [0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert ext_inputs.positions.tolist() == inputs.positions.tolist()
    assert ext_inputs.last_idx.tolist() == inputs.last_idx.tolist() == [0, 5, 8]
    want = runner.forward(ext_fb)  # [9, V]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_verify_step_past_the_cap_or_with_a_prefill_chunk_stays_an_extend():
    _, verify = plans(1)
    capped = BatchBuilder(4, 128, torch.device("cpu"), max_decode_rows=8)  # 9 tokens
    capped.build(plans(1)[0])
    assert not capped.build(verify)[0].is_decode
    builder = BatchBuilder(4, 128, torch.device("cpu"), max_decode_rows=256)
    builder.build(plans(1)[0])
    chunk = msgspec.structs.replace(  # request 0: two tokens and no drafts
        verify, extend_lens=[2, 5, 3], input_ids=verify.input_ids[:1] + verify.input_ids,
        new_pages=verify.new_pages[:1] + [100] + verify.new_pages[1:])
    assert not builder.build(chunk)[0].is_decode
    unsampled = msgspec.structs.replace(verify, sample=[False, True, True])
    assert not builder.build(unsampled)[0].is_decode


def test_served_verify_steps_run_as_decode_batches(monkeypatch):
    """Served with n-gram drafts: every step of plain decodes and verifies is a decode
    batch of one row a token, and the outputs are plain decoding's."""
    prompts, params, ref = greedy_case(CFG, repetitive_prompts(3, (4, 11, 7)), (20, 30, 12))
    cfg = CFG.replace(speculative_algorithm="ngram", speculative_num_draft_tokens=K)
    worker = Worker(cfg, resolve_model(cfg.model))
    assert worker.builder.max_decode_rows == EAGER_DECODE_ROWS
    build, verify_steps = worker.builder.build, []

    def spy(plan: BatchPlan):
        fb, inputs = build(plan)
        if plan.draft_lens and all(plan.sample) and all(e == d + 1 for e, d in zip(plan.extend_lens,
                                                              plan.draft_lens)):
            verify_steps.append((fb.is_decode, fb.batch_size, sum(plan.extend_lens)))
        return fb, inputs
    monkeypatch.setattr(worker.builder, "build", spy)
    outs, sched, _ = serve(cfg, prompts, params, worker=worker)
    assert outs == ref and sched.spec.verify_steps > 0
    assert verify_steps and all(d and b == t for d, b, t in verify_steps), verify_steps
    assert any(b > 3 for _, b, _ in verify_steps)  # more rows than requests


@pytest.mark.gpu
def test_a_verify_step_replays_a_cuda_graph_with_the_extend_paths_greedy_tokens():
    runner = ModelRunner(resolve_model("dummy:tiny"), "cuda", torch.float32, kv_slots=512,
                         max_rows=4, page_size=16, graph_rows=16)
    assert runner.max_decode_rows == 16
    builder = BatchBuilder(4, 128, torch.device("cuda"), 16, max_decode_rows=16)
    prefill, verify = plans(16)
    runner.forward(builder.build(prefill)[0])
    fb, _ = builder.build(verify)
    assert fb.is_decode and runner.graphs.can_run(fb)
    got = runner.forward(fb)  # [9, V] from the graph of 12 rows
    builder.max_decode_rows = 0
    ext_fb, _ = builder.build(verify)
    assert not runner.graphs.can_run(ext_fb)
    want = runner.forward(ext_fb)  # [9, V] eager extend
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=0.01 * scale, rtol=0)  # TF32 attention
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
