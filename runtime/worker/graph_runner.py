"""`GraphRunner`: CUDA graphs of the decode forward, captured at start-up per batch size.

A decode step of B sequences replays the graph of the smallest captured size >= B (a
verify step's tokens are sequences of their own there, `BatchBuilder`). The
model's inputs are copied into static buffers here, the page table and lengths into the
attention backend's (`AttentionBackend.prepare_replay`); padded rows read nothing
(sequence length 0) and write their K/V into slot 0, the padding sink. The logits of the
first B rows are returned, and with `capture` the features a draft head reads
(`CausalLM.forward_features`) of those rows. A model keeping state per request row reads
the batch's rows (`ForwardBatch.rows`) from a static buffer too, padding rows naming its
`sink_row`; what it sizes by the host lengths it sizes at capture for `max_context`, the
longest sequence a replay may hold (`can_run`). With LoRA adapters the graphs read the
step's adapter segments from static buffers too (`LoraBatch.static`), sized for every
row of the graph. With `greedy` a graph returns each row's greedy token id instead of its
logits (a draft model's steps, `DraftModel`): the logits stay inside the graph's memory
pool, which the smaller sizes reuse, and only `[B]` ids are kept a size. A subclass may
capture another step over the same batch by its `_outputs` (a draft head's, `HeadGraphs`).
"""

from __future__ import annotations

import bisect
import logging

import torch

from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.lora.batch import LoraBatch
from runtime.worker.lora.manager import LoraManager

log = logging.getLogger("sluice.worker")

CAPTURE_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class GraphRunner:
    """Captured decode graphs of one model, attention backend and KV pool."""

    def __init__(
        self,
        model,
        attn: AttentionBackend,
        max_bs: int,
        max_context: int,
        device: torch.device,
        page_size: int = 1,
        lora: LoraManager | None = None,
        capture: tuple[int, ...] | None = None,
        sink_row: int = 0,
        greedy: bool = False,
    ) -> None:
        self.model, self.attn, self.device = model, attn, device
        self.greedy = greedy
        self.max_context, self.sink_row = max_context, sink_row
        self.lora = lora
        self.capture = capture
        self.page_size = page_size
        self.sizes = [s for s in CAPTURE_SIZES if s <= max_bs] or [max_bs]
        n = self.sizes[-1]
        attn.init_graph(n, max_context, page_size)
        i64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(n, **i64)  # [N]
        self.positions = torch.zeros(n, **i64)  # [N]
        self.out_slots = torch.zeros(n, **i64)  # [N] padding rows write slot 0
        self.rows = torch.full((n,), sink_row, **i64)  # [N] request rows
        self.arange = torch.arange(n + 1, dtype=torch.int32, device=device)  # qo_indptr, rows
        self.zeros = torch.zeros(n + 1, dtype=torch.int32, device=device)  # empty sequences
        self.no_pages = torch.zeros(0, **i64)  # [0]
        self.lora_batch = LoraBatch.static(n, lora.num_slots, device) if lora else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}  # logits or ids (features)
        self.pool = None

    def _batch(self, bs: int) -> ForwardBatch:
        """The batch a graph of `bs` rows is captured with: `bs` empty sequences (on the
        host as long as the longest replay, `max_context`), the backend's metadata
        pointing at its static buffers."""
        fb = ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            out_slots=self.out_slots[:bs], qo_indptr=self.arange[: bs + 1],
            kv_indptr=self.zeros[: bs + 1], kv_indices=self.no_pages,
            seq_lens=self.zeros[:bs], prefix_lens=self.zeros[:bs],
            sample_idx=self.arange[:bs].long(), is_decode=True,
            seq_lens_cpu=[self.max_context] * bs, prefix_lens_cpu=[0] * bs,
            extend_lens_cpu=[1] * bs, page_size=self.page_size, rows=self.rows[:bs],
        )  # fmt: skip
        self.attn.prepare_capture(fb)
        return fb

    def _forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """(logits [B, vocab]) or, with `capture`, (logits, features [B, w]); with
        `greedy`, (ids [B] int64)."""
        if self.lora is None:
            return self._outputs(fb)
        # the LoRA kernels' grids cover this graph's rows
        static = self.lora_batch
        batch = LoraBatch(static.order[:fb.batch_size], static.indptr, None, fb.batch_size)
        with self.lora.step.applying(batch):
            return self._outputs(fb)

    def _outputs(self, fb: ForwardBatch) -> tuple[torch.Tensor, ...]:
        if self.capture is None:
            logits = self.model.compute_logits(self.model(fb, self.attn))  # [B, vocab]
            return (logits.argmax(dim=-1),) if self.greedy else (logits,)  # [B] or [B, V]
        hidden, features = self.model.forward_features(fb, self.attn, self.capture)
        return self.model.compute_logits(hidden), features  # [B, vocab], [B, w]

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first so smaller graphs reuse its memory pool."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):
                fb = self._batch(bs)
                for _ in range(2):  # warm-up: JIT-compile kernels, settle allocations
                    self._forward(fb)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.outputs[bs] = self._forward(fb)
                self.pool = graph.pool()
                self.graphs[bs] = graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        log.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.is_decode and fb.batch_size <= self.sizes[-1]
                and fb.page_size == self.page_size
                and max(fb.seq_lens_cpu, default=0) <= self.max_context)

    def replay(self, fb: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """Run a decode batch through its graph: (logits [B, vocab] fp32), with `capture`
        (logits, features [B, w]), with `greedy` (ids [B] int64). The outputs are views of
        the graph's static buffers, valid until its next replay."""
        padded = self.load(fb)
        self.graphs[padded].replay()
        return tuple(out[: fb.batch_size] for out in self.outputs[padded])

    def load(self, fb: ForwardBatch) -> int:
        """Copy the decode batch `fb` into the static buffers of the smallest captured size
        that holds it, the rows past it padding; that size."""
        bs = fb.batch_size
        padded = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.input_ids[:bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:bs].copy_(fb.positions, non_blocking=True)
        self.out_slots[:bs].copy_(fb.out_slots, non_blocking=True)
        if fb.rows is not None:
            self.rows[:bs].copy_(fb.rows, non_blocking=True)
        if padded > bs:  # padding rows: empty sequences writing into the sinks
            self.input_ids[bs:padded].zero_()
            self.positions[bs:padded].zero_()
            self.out_slots[bs:padded].zero_()
            self.rows[bs:padded].fill_(self.sink_row)
        if self.lora_batch is not None:
            self.lora_batch.fill(fb.lora)
        self.attn.prepare_replay(fb, padded)
        return padded
