"""Test helper: a drafter's decode graphs on the CPU (a draft model's or a head's), and
two workers stepped over the same plans.

`EagerReplays` is a `GraphRunner` whose replay runs what the captured graph runs, without
the graph: the batch copied into the static buffers (`load`), then the capture batch of
that size run eagerly, its attention reading the static page table. `TorchGraphAttention`
is that static page table (`TritonAttention`'s buffers) over the kernels' torch
references, so the path runs in plain torch (`TorchGraphMLAAttention` over a latent pool).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from kernels.attention.decode import decode_attention_ref
from kernels.attention.extend_ref import extend_attention_ref
from kernels.attention.mla_decode import mla_decode_ref
from kernels.attention.mla_extend import mla_extend_ref
from kernels.kv.store import store_kv_ref
from runtime.config.server import ServerConfig
from runtime.wire.sampling import SamplingParams
from runtime.wire.worker_channel import BatchPlan, StepResult
from runtime.worker.attention_mla import LatentAttention
from runtime.worker.attention_triton import TritonAttention
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.graph_runner import GraphRunner
from runtime.worker.kv_pool import LayerKV
from runtime.worker.speculative.draft_model import DraftModel
from runtime.worker.speculative.head_graphs import HeadGraphs
from runtime.worker.worker import Worker
from tests.speculative.serve import serve, start


class TorchGraphAttention(TritonAttention):
    """`TritonAttention`'s page table (a decode graph's static copy in a capture batch)
    read by the torch references; a decode pads every sequence to the batch's longest on
    the host, in a capture batch the graph's context."""

    fuses_rope = False
    decode_kernel = staticmethod(decode_attention_ref)
    extend_kernel = staticmethod(extend_attention_ref)

    def store(self, layer: LayerKV, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
        store_kv_ref(k, v, layer.k, layer.v, fb.out_slots, k_scale=layer.k_scale,
                     v_scale=layer.v_scale)

    def decode_options(self, fb: ForwardBatch) -> dict[str, Any]:
        return {"max_seq_len": max(fb.seq_lens_cpu)}

    def extend_options(self, fb: ForwardBatch) -> dict[str, Any]:
        return {}


class TorchGraphMLAAttention(LatentAttention, TorchGraphAttention):
    """`TorchGraphAttention` over a latent pool: the MLA references."""

    decode_kernel = staticmethod(mla_decode_ref)
    extend_kernel = staticmethod(mla_extend_ref)


class EagerReplays(GraphRunner):
    """Replays without graphs (see the module docstring); `replays` holds (rows, graph
    size) of each."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replays: list[tuple[int, int]] = []

    def replay(self, fb: ForwardBatch) -> tuple[torch.Tensor, ...]:
        padded = self.load(fb)
        self.replays.append((fb.batch_size, padded))
        return tuple(out[: fb.batch_size] for out in self._forward(self._batch(padded)))


class EagerHeadReplays(EagerReplays, HeadGraphs):
    """A head's graphs (`HeadGraphs`) replayed without graphs."""


def graph_path(worker: Worker, rows: int, attn: TritonAttention | None = None,
               context: int = 0) -> EagerReplays:
    """Give `worker`'s drafter (a draft model, or a head) decode graphs of up to `rows`
    rows and `context` tokens (0: the target's) run by `EagerReplays` over `attn` (None: a
    `TorchGraphAttention` of its pool, or `TorchGraphMLAAttention`), which its eager
    forwards use too; those graphs."""
    drafter, context = worker.drafter, context or worker.runner.max_context
    if isinstance(drafter, DraftModel):
        drafter.attn = attn or TorchGraphAttention(drafter.pool)
        drafter.graphs = EagerReplays(drafter.model, drafter.attn, rows, context,
                                      drafter.device, worker.page_size, greedy=True)
        return drafter.graphs
    mla = getattr(drafter.head, "mla", None)
    drafter.attn = attn or (TorchGraphMLAAttention(drafter.pool, mla) if mla is not None
                            else TorchGraphAttention(drafter.pool))
    drafter.graphs = EagerHeadReplays(drafter.head, drafter.target, drafter.attn, rows, context,
                                      drafter.device, drafter.dtype)
    return drafter.graphs


def lockstep(cfg: ServerConfig, workers: tuple[Worker, Worker], prompts: list[list[int]],
             params: list[SamplingParams]) -> Iterator[tuple[BatchPlan, StepResult, StepResult]]:
    """Serve the requests to their end on the first worker, launching each of its plans
    on the second too (the same target: the same plans fit both): (the plan, its results
    on both) a step."""
    sched, _ = start(cfg, workers[0], prompts, params)
    while sched.has_work:
        plan = sched.plan()
        got = [w.launch(plan).result() for w in workers]
        yield plan, got[0], got[1]
        sched.on_result(got[0])
        sched.take_outputs()


def assert_lockstep_replays(cfg: ServerConfig, workers: tuple[Worker, Worker],
                            graphs, prompts: list[list[int]], params: list[SamplingParams],
                            forwards) -> None:
    """Serve in `lockstep` on an eager and a graphed worker: every step's drafts are the
    same on both, the graphed one replays `graphs` for exactly the one-token forwards
    `forwards(plan)` lists, and a step of three requests ran in the graph of four rows."""
    seen = 0
    for plan, want, got in lockstep(cfg, workers, prompts, params):
        assert got.draft_ids == want.draft_ids
        assert [rows for rows, _ in graphs.replays[seen:]] == forwards(plan)
        seen = len(graphs.replays)
    assert (3, 4) in graphs.replays  # three requests' step in the graph of four rows


def assert_captured_drafts_eager(cfg: ServerConfig, graphed: Worker, eager: Worker,
                                 prompts: list[list[int]],
                                 params: list[SamplingParams]) -> None:
    """On a GPU: `graphed`'s drafter captured graphs as large as its target's, and drafts
    as `eager`'s (its graphs taken away) at every step, a three-request step replayed."""
    graphs = graphed.drafter.graphs
    assert graphs is not None and graphs.sizes == graphed.runner.graphs.sizes
    eager.drafter.graphs = None
    replays = []
    replay = graphs.replay
    graphs.replay = lambda fb: replays.append(fb.batch_size) or replay(fb)
    for _, want, got in lockstep(cfg, (eager, graphed), prompts, params):
        assert got.draft_ids == want.draft_ids
    assert 3 in replays


def serve_counting_decodes(cfg: ServerConfig, prompts: list[list[int]],
                           params: list[SamplingParams], worker: Worker,
                           module: torch.nn.Module, arg: int):
    """Serve the requests to their end on `worker`, recording the rows of every decode
    forward of `module` (its ForwardBatch: positional argument `arg`), replayed or not;
    every slot comes back. Returns (outputs, the scheduler, those rows)."""
    decodes = []
    module.register_forward_pre_hook(
        lambda _, args: decodes.append(args[arg].batch_size) if args[arg].is_decode else None)
    outs, sched, _ = serve(cfg, prompts, params, worker=worker)
    assert sched.kv.stats().used == 0
    return outs, sched, decodes


def head_decode_forwards(plan: BatchPlan) -> list[int]:
    """The rows of each forward of a head in `plan` that feeds one token a request, in
    order: every draft step, then `absorb` when each request computes one position >= 1."""
    d = [x for x in plan.draft_lens if x]
    steps = [sum(x > j for x in d) for j in range(max(d, default=0))]
    lens = [e - (p == 0) for p, e in zip(plan.prefix_lens, plan.extend_lens) if e > (p == 0)]
    return steps + ([len(lens)] if lens and set(lens) == {1} else [])


def decode_forwards(plan: BatchPlan) -> list[int]:
    """The rows of each forward of the draft model in `plan` that feeds one token a
    request, in order: the draft steps but a step 0 with owed tokens, then the mirror of
    the other requests when each feeds one token (its owed one or its new one; with no
    draft step and nothing owed, the target's batch as built: a decode batch)."""
    n = len(plan.rows)
    if not plan.draft_lens and not plan.draft_backfill:
        decode = set(plan.extend_lens) == {1} and all(plan.sample) and not plan.input_logprobs
        return [n] if decode else []
    lens = plan.draft_lens or [0] * n
    owed = plan.draft_backfill or [-1] * n
    d = [x for x in lens if x]
    steps = [sum(x > j for x in d) for j in range(max(d, default=0))]
    if any(o >= 0 for o, x in zip(owed, lens) if x):
        steps = steps[1:]
    plain = [e + (o >= 0) for e, o, x in zip(plan.extend_lens, owed, lens) if not x]
    return steps + ([len(plain)] if plain and set(plain) == {1} else [])
