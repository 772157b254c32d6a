"""An EAGLE head's and an MTP layer's draft steps through their CUDA graphs
(`HeadDrafter.graphs`, `HeadGraphs`).

On the CPU, through what a replay runs (`EagerReplays`: the static buffers, the hidden
states' included, filled before the capture batch runs eagerly over the static page
table): every head forward that feeds one token a request goes through it, and its drafts,
head KV and feature rows are the eager path's (steps of three requests padded to the graph
of four rows included); greedy outputs are plain decoding's; the captured step reads no
tensor's values on the host. On a GPU, the captured graphs draft as the eager path does.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.worker import Worker
from tests.speculative import test_eagle, test_mtp
from tests.speculative.eagle_heads import target_checkpoint, write_head
from tests.speculative.graph_path import (
    assert_captured_drafts_eager,
    assert_lockstep_replays,
    graph_path,
    head_decode_forwards,
    serve_counting_decodes,
)
from tests.speculative.mtp_layers import MtpReference
from tests.speculative.serve import serve
from tests.worker.test_deepseek_v4_graph import DenseMoeOps

HEADS = ["eagle", "eagle3", "mtp"]


@pytest.fixture(scope="module", name="configs")
def configs_fixture(tmp_path_factory) -> dict[str, tuple[ServerConfig, ServerConfig]]:
    """(plain decoding's config, the head's) by head: EAGLE and EAGLE-3 heads of a tiny
    Llama, the MTP layer of a tiny DeepSeek-V3 (MLA, MoE)."""
    target = tmp_path_factory.mktemp("target")
    target_checkpoint(target)
    configs = {}
    for name, eagle3 in (("eagle", False), ("eagle3", True)):
        folder = tmp_path_factory.mktemp(name)
        write_head(folder, eagle3)
        configs[name] = (test_eagle.config((target, None)),
                         test_eagle.config((target, None), folder))
    mtp = tmp_path_factory.mktemp("mtp")
    MtpReference(mtp)
    configs["mtp"] = (test_mtp.config(mtp, mtp=False), test_mtp.config(mtp, max_running=4))
    return configs


def head_state(worker: Worker) -> list[torch.Tensor]:
    """The head's pool and feature rows but the padding slot 0."""
    return [t[1:] for t in worker.drafter.slot_tensors()]


@pytest.mark.parametrize("kv", ["token", "paged"])
@pytest.mark.parametrize("name", HEADS)
def test_drafts_and_head_kv_are_the_eager_paths(configs, name, kv):
    cfg = configs[name][1].replace(kv=kv)
    eager, graphed = (Worker(cfg, resolve_model(cfg.model)) for _ in range(2))
    graphs = graph_path(graphed, 4)
    prompts, params = test_eagle.prompts_and_params()
    assert_lockstep_replays(cfg, (eager, graphed), graphs, prompts, params,
                            head_decode_forwards)
    for got, want in zip(head_state(graphed), head_state(eager), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", HEADS)
def test_greedy_outputs_are_plain_decodings(configs, name):
    """Graphs of up to two rows: steps of more requests run eagerly beside them."""
    plain, cfg = configs[name]
    prompts, params = test_eagle.prompts_and_params()
    ref, _, _ = serve(plain, prompts, params)
    worker = Worker(cfg, resolve_model(cfg.model))
    graphs = graph_path(worker, 2)
    outs, sched, decodes = serve_counting_decodes(cfg, prompts, params, worker,
                                                  worker.drafter.head, 2)
    assert outs == ref
    assert sched.spec.verify_steps > 0 and graphs.replays
    assert max(decodes) > 2  # eagerly


@pytest.mark.parametrize("name", HEADS)
def test_the_captured_step_reads_nothing_on_the_host(configs, name):
    """The capture batch under FakeTensorMode (where `.item()`, `.tolist()` and ops whose
    output shape depends on values raise). The routed experts' torch reference finds the
    experts hit on the host (the Triton kernel a GPU runs does not): a dense stand-in
    takes its place."""
    cfg = configs[name][1]
    worker = Worker(cfg, resolve_model(cfg.model))
    graphs = graph_path(worker, 8)
    head = worker.drafter.head
    head.ops = DenseMoeOps(head.ops.cos_sin_cache)
    fb = graphs._batch(8)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        ids, out = graphs._forward(fb)
    assert ids.shape == (8,) and ids.dtype == torch.int64
    assert out.shape == (8, head.hidden_size)


@pytest.mark.gpu
@pytest.mark.parametrize("name", HEADS)
def test_captured_graphs_draft_as_the_eager_path(configs, name):
    """Graphs captured at start-up, as large as the target's; the same drafts as a head
    without graphs, every step, and its KV to float rounding (split counts differ)."""
    cfg = configs[name][1].replace(device="cuda", kv="paged")
    graphed, eager = (Worker(cfg, resolve_model(cfg.model)) for _ in range(2))
    assert_captured_drafts_eager(cfg, graphed, eager, *test_eagle.prompts_and_params())
    for got, want in zip(head_state(graphed), head_state(eager), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
