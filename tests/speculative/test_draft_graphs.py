"""A draft model's decode steps through its CUDA graphs (`DraftModel.graphs`).

On the CPU, through what a replay runs (`EagerReplays`: the static buffers filled by
`load`, the capture batch run eagerly over the static page table): every forward of the
draft that feeds one token a request goes through it, its drafts and draft KV are the
eager path's (steps of three requests padded to the graph of four rows included), greedy
outputs are plain decoding's with steps of more rows than the largest graph, or longer
contexts, running eagerly beside them, and the captured step reads no tensor's values on
the host. On a GPU, the captured graphs draft as the eager path does.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.attention_triton import TritonAttention
from runtime.worker.worker import Worker
from tests.speculative.graph_path import (
    assert_captured_drafts_eager,
    assert_lockstep_replays,
    decode_forwards,
    graph_path,
    lockstep,
    serve_counting_decodes,
)
from tests.speculative.serve import greedy_case, serve
from tests.speculative.test_draft_model import DRAFT
from tests.speculative.test_exact import CFG, repetitive_prompts

PROMPTS = repetitive_prompts(5, (5, 17, 2))  # three requests: a graph of 4 rows, padded
PARAMS = [SamplingParams(max_tokens=m, temperature=0.0) for m in (14, 9, 11)]
DRAFTS = ["dummy:tiny", "dummy:tiny-draft"]  # every draft accepted (tokens owed), or few


def two_workers(cfg) -> tuple[Worker, Worker]:
    return Worker(cfg, resolve_model(cfg.model)), Worker(cfg, resolve_model(cfg.model))


def draft_kv(worker: Worker) -> list[torch.Tensor]:
    """The draft pool but its padding slot 0."""
    pool = worker.drafter.pool
    return [t[1:] for t in pool.k + pool.v]


@pytest.mark.parametrize("kv", ["token", "paged"])
@pytest.mark.parametrize("draft", DRAFTS)
def test_drafts_and_draft_kv_are_the_eager_paths(kv, draft):
    cfg = DRAFT.replace(kv=kv, speculative_draft_model=draft)
    eager, graphed = two_workers(cfg)
    graphs = graph_path(graphed, 8)
    assert_lockstep_replays(cfg, (eager, graphed), graphs, PROMPTS, PARAMS, decode_forwards)
    for got, want in zip(draft_kv(graphed), draft_kv(eager), strict=True):
        torch.testing.assert_close(got, want)


def test_the_kernels_a_gpu_runs_draft_as_the_eager_path():
    """The Triton kernels (interpreted) over the graph's static page table."""
    cfg = DRAFT.replace(kv="paged", speculative_draft_model="dummy:tiny-draft")
    eager, graphed = two_workers(cfg)
    graphs = graph_path(graphed, 4, TritonAttention(graphed.drafter.pool))
    for _, want, got in lockstep(cfg, (eager, graphed), PROMPTS, PARAMS[1:2] * 3):
        assert got.draft_ids == want.draft_ids
    assert (3, 4) in graphs.replays
    for got, want in zip(draft_kv(graphed), draft_kv(eager), strict=True):
        torch.testing.assert_close(got, want)


@pytest.fixture(scope="module", name="five")
def five_requests():
    return greedy_case(CFG, repetitive_prompts(9, (5, 17, 2, 8, 11)), (12, 9, 15, 7, 10))


@pytest.mark.parametrize("kv", ["token", "paged", "contiguous"])
@pytest.mark.parametrize("draft", DRAFTS)
def test_greedy_outputs_are_plain_decodings(five, kv, draft):
    """Graphs of up to four rows: a step of five requests runs eagerly, one of three
    replays the graph of four."""
    prompts, params, ref = five
    cfg = DRAFT.replace(kv=kv, speculative_draft_model=draft)
    worker = Worker(cfg, resolve_model(cfg.model))
    graphs = graph_path(worker, 4)
    outs, sched, decodes = serve_counting_decodes(cfg, prompts, params, worker,
                                                  worker.drafter.model, 0)
    assert outs == ref
    assert sched.spec.verify_steps > 0
    assert (3, 4) in graphs.replays and 5 in decodes  # five rows: eagerly


def test_contexts_past_the_graphs_run_eagerly(five):
    """Graphs of up to 24 tokens: longer sequences' steps run eagerly."""
    prompts, params, ref = five
    cfg = DRAFT.replace(speculative_draft_model="dummy:tiny-draft")
    worker = Worker(cfg, resolve_model(cfg.model))
    graphs = graph_path(worker, 8, context=24)
    longest = []  # the longest sequence of each decode forward of the draft
    worker.drafter.model.register_forward_pre_hook(
        lambda _, args: longest.append(max(args[0].seq_lens_cpu)) if args[0].is_decode
        else None)
    outs, _, _ = serve(cfg, prompts, params, worker=worker)
    assert outs == ref
    assert graphs.replays and max(longest) > 24


def test_the_captured_step_reads_nothing_on_the_host():
    """The capture batch under FakeTensorMode: `.item()`, `.tolist()`, `bool()` of a
    tensor and ops whose output shape depends on values raise there."""
    worker = Worker(DRAFT, resolve_model(DRAFT.model))
    graphs = graph_path(worker, 8)
    fb = graphs._batch(8)
    with pytest.raises(DataDependentOutputException), \
            FakeTensorMode(allow_non_fake_inputs=True):
        fb.positions.sum().item()  # the guard at work
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        ids = graphs._forward(fb)[0]
    assert ids.shape == (8,) and ids.dtype == torch.int64


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["token", "paged"])
def test_captured_graphs_draft_as_the_eager_path(kv):
    """Graphs captured at start-up, as large as the target's; the same drafts as a draft
    without graphs, every step, and its KV to float rounding (split counts differ)."""
    cfg = DRAFT.replace(device="cuda", kv=kv, speculative_draft_model="dummy:tiny-draft")
    graphed, eager = two_workers(cfg)
    assert_captured_drafts_eager(cfg, graphed, eager, PROMPTS, PARAMS)
    for got, want in zip(draft_kv(graphed), draft_kv(eager), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
