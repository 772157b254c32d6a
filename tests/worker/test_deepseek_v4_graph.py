"""DeepSeek-V4 decode through what its CUDA graphs capture, on the CPU: a `GraphRunner`'s
static buffers filled by `load`, then its capture batch run eagerly (what a replay runs,
without the graph), fp32 on a tiny random checkpoint, the visible-entry lists as wide as
the graphs' context, over decode steps that cross window and compression-block boundaries,
in the token (entry ids from the page table or from entry tables) and paged layouts,
against the eager decode of the same steps:

- with the kernels a GPU runs (interpreted), four sequences in the graph of four rows: the
  same logits and state, bit for bit (the lists' padding adds nothing);
- five sequences padded to the graph of eight rows (torch references): the real rows'
  logits equal to fp32 rounding (a matmul of eight rows rounds unlike one of five on the
  CPU), and the padding rows wrote only the sinks: the pools, entry pools, rings and row
  starts are the eager run's but for slot 0, entry id 0 and the sink row.

The captured step reads no tensor's values on the host: under FakeTensorMode, where any
such read raises."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from runtime.model_config import resolve_model
from runtime.worker.attention_triton import TritonAttention
from runtime.worker.graph_runner import GraphRunner
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
from runtime.worker.models.deepseek_v4_state import graph_context
from runtime.worker.ops import TorchOps, TritonOps
from tests.worker.batching import Chunk, make_batch
from tests.worker.dsv4_checkpoints import interleave_entries, tiny_v4

# prefill lengths: window 8, entries every 4 (CSA) and 8 (HCA); decode steps after them
PROMPTS = [13, 6, 9, 16, 3]
MAX_ROWS = 6  # request rows: the sink row is 6
# (page size, entry ids from the entry tables)
LAYOUTS = [(1, False), (4, False), (1, True)]


def graph_path(runner: ModelRunner, rows: int, page_size: int) -> GraphRunner:
    """Decode graphs' inputs of up to `rows` rows over `runner`'s model and pool
    (TritonAttention's static page table, plain torch), never captured."""
    return GraphRunner(runner.model, TritonAttention(runner.kv_pool), rows,
                       runner.max_context, runner.device, page_size, sink_row=MAX_ROWS)


def state(runner: ModelRunner) -> list[torch.Tensor]:
    """The pool without the sink slot, the entry pools without the sink id, each ring and
    the row starts without the sink row."""
    model = runner.model
    rings = [t[:-1] for layer in model.model.layers for c in layer.attn.compressors()
             for t in (c.ring.kv, c.ring.gate)]
    entries = [t[1:] for pools in (model.entries.entry, model.entries.idx_key)
               for t in pools.values()]
    return [k[1:] for k in runner.kv_pool.k] + entries + rings + [model.starts.starts[:-1]]


def decode_both(tmp_path, prompts: list[int], steps: int, rows: int,
                layout: tuple[int, bool], ops: TorchOps | None,
                check) -> tuple[ModelRunner, ModelRunner]:
    """Prefill `prompts` on two runners (eagerly), then decode `steps` tokens a sequence,
    eagerly on one and through the graph path of `rows` rows on the other, each step's
    logits compared by `check(got, want)`; the two runners. `layout`: (page size, entry
    ids from the entry tables)."""
    tiny_v4(tmp_path)
    spec = resolve_model(str(tmp_path))
    page_size, table = layout
    eager, padded = (ModelRunner(spec, "cpu", torch.float32, kv_slots=512, max_rows=MAX_ROWS,
                                 entry_table=table) for _ in range(2))
    graphs = graph_path(padded, rows, page_size)
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, 256, (n + steps,), generator=gen).tolist() for n in prompts]
    seqs = len(prompts)
    prefill = [Chunk(s, ids[s][:n]) for s, n in enumerate(prompts)]
    for runner in (eager, padded):
        if ops is not None:
            runner.model.model.ops = ops
        runner.model.bind_rows(list(range(seqs)))
        if table:
            interleave_entries(runner.model, seqs)
        runner.forward(make_batch(prefill, [0] * seqs, seqs, page_size=page_size))
    lens = list(prompts)
    with torch.inference_mode():
        for _ in range(steps):
            chunks = [Chunk(s, [ids[s][n]]) for s, n in enumerate(lens)]
            want = eager.forward(make_batch(chunks, lens, seqs, page_size=page_size))
            padded_rows = graphs.load(make_batch(chunks, lens, seqs, page_size=page_size))
            assert padded_rows == rows
            got = graphs._forward(graphs._batch(padded_rows))[0][:seqs]  # what a replay runs
            check(got, want)
            lens = [n + 1 for n in lens]
    return eager, padded


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_lists_change_no_bit(layout, tmp_path):
    def identical(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.equal(got, want)

    eager, padded = decode_both(tmp_path, PROMPTS[:4], 6, 4, layout, TritonOps(None),
                                identical)
    for got, want in zip(state(padded), state(eager), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_padding_rows_write_only_the_sinks(layout, tmp_path):
    def check(got: torch.Tensor, want: torch.Tensor) -> None:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()

    eager, padded = decode_both(tmp_path, PROMPTS, 12, 8, layout, None, check)
    for got, want in zip(state(padded), state(eager), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def dense_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor, *, swiglu_limit: float = 0.0) -> torch.Tensor:
    """`fused_moe` through every expert, weighted 0 where not picked: no host read."""
    picked = torch.zeros(x.shape[0], w13.shape[0]).scatter_add(1, ids, weights.float())
    gate, up = torch.einsum("th,eih->tei", x.float(), w13.float()).chunk(2, dim=-1)
    if swiglu_limit > 0:
        gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
    out = torch.einsum("tei,ehi->teh", F.silu(gate) * up, w2.float())  # [T, E, H]
    return (picked[..., None] * out).sum(dim=1).to(x.dtype)


class DenseMoeOps(TorchOps):
    fused_moe = staticmethod(dense_moe)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_captured_step_reads_nothing_on_the_host(layout, tmp_path):
    """The captured step under FakeTensorMode: `.item()`, `.tolist()`, `bool()` of a
    tensor and ops whose output shape depends on values raise there. The routed experts'
    torch reference finds the experts hit on the host (the Triton kernel a GPU runs does
    not): a dense stand-in takes its place."""
    tiny_v4(tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=512,
                         max_rows=MAX_ROWS, entry_table=layout[1])
    graphs = graph_path(runner, 8, layout[0])
    runner.model.model.ops = DenseMoeOps(None)
    fb = graphs._batch(8)
    for read, caught in ((lambda t: t.sum().item(), DataDependentOutputException),
                         (lambda t: t.nonzero(), DynamicOutputShapeException)):
        with pytest.raises(caught), FakeTensorMode(allow_non_fake_inputs=True):
            read(fb.positions)  # the guard at work
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        logits = graphs._forward(fb)[0]
    assert logits.shape == (8, 256)


def test_graph_context_caps_the_visible_lists():
    """The Flash preset (65536 tokens, CSA rate 4) at 256 rows: `[256, 16384]` int32, 16
    MiB: graphs serve its whole context; a context of 1M tokens is capped where that list
    reaches 32 MiB, 131072 tokens (longer decode steps run eagerly)."""
    flash = DeepseekV4Arch.from_hf(resolve_model("dummy:deepseek-v4-flash").hf_config())
    assert graph_context(flash, 256, 65536) == 65536
    assert graph_context(flash, 256, 2**20) == 131072
    assert graph_context(flash, 8, 2**20) == 2**20
