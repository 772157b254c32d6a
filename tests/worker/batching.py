"""Test helper: ForwardBatches over a simple slot layout, a driver that runs steps, and
batched greedy decoding on it.

Position p of sequence s lives at slot 1 + p * num_seqs + s: sequences interleave in the
pool (so every gather really goes through the page table) and slot 0 stays the padding sink.
With pages of `page_size` slots, page j of sequence s is page 1 + j * num_seqs + s (page 0
holds the sink); page size 1 is the layout above.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from runtime.worker.attention import AttentionBackend
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.model_runner import ModelRunner


@dataclass
class Chunk:
    """New tokens of one sequence in one step; `sample` returns the last token's logits."""

    seq: int
    ids: list[int]
    sample: bool = True


def page(num_seqs: int, seq: int, index: int) -> int:
    return 1 + index * num_seqs + seq


def slot(num_seqs: int, seq: int, pos: int, page_size: int = 1) -> int:
    return page(num_seqs, seq, pos // page_size) * page_size + pos % page_size


def make_batch(
    chunks: list[Chunk],
    prefix_lens: list[int],
    num_seqs: int,
    sample_all: bool = False,
    device: str = "cpu",
    page_size: int = 1,
) -> ForwardBatch:
    """One step: chunk i extends sequence chunks[i].seq, which has prefix_lens[i] cached.

    `sample_all` returns logits of every new token instead of each sampled chunk's last.
    """
    ext = [len(c.ids) for c in chunks]
    seq_lens = [p + e for p, e in zip(prefix_lens, ext)]
    num_pages = [-(-n // page_size) for n in seq_lens]
    positions = [p + j for p, e in zip(prefix_lens, ext) for j in range(e)]
    seqs = [c.seq for c, e in zip(chunks, ext) for _ in range(e)]
    ends = list(accumulate(ext))
    if sample_all:
        sample_idx = list(range(sum(ext)))
    else:
        sample_idx = [end - 1 for end, c in zip(ends, chunks) if c.sample]

    def tensor(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=tensor([i for c in chunks for i in c.ids]),
        positions=tensor(positions),
        out_slots=tensor([slot(num_seqs, s, p, page_size) for s, p in zip(seqs, positions)]),
        qo_indptr=tensor([0, *ends], torch.int32),
        kv_indptr=tensor([0, *accumulate(num_pages)], torch.int32),
        kv_indices=tensor(
            [page(num_seqs, c.seq, j) for c, n in zip(chunks, num_pages) for j in range(n)]
        ),
        seq_lens=tensor(seq_lens, torch.int32),
        prefix_lens=tensor(prefix_lens, torch.int32),
        sample_idx=tensor(sample_idx),
        is_decode=all(e == 1 for e in ext),
        seq_lens_cpu=seq_lens,
        prefix_lens_cpu=list(prefix_lens),
        extend_lens_cpu=ext,
        page_size=page_size,
        rows=tensor([c.seq for c in chunks]),
    )


def attend(
    backend: AttentionBackend,
    layer_id: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fb: ForwardBatch,
) -> torch.Tensor:
    """One layer's attention of an eager step, as the model runs it: prepare, then forward."""
    backend.prepare(fb)
    return backend.forward(layer_id, q, k, v, fb)


class Driver:
    """Runs steps through a ModelRunner, tracking each sequence's cached length."""

    def __init__(self, runner: ModelRunner, num_seqs: int) -> None:
        self.runner, self.num_seqs = runner, num_seqs
        self.lens = [0] * num_seqs
        runner.model.bind_rows(list(range(num_seqs)))  # new requests on the rows

    def step(self, chunks: list[Chunk], sample_all: bool = False) -> torch.Tensor:
        """Logits [S, V] of the step (S = sampled chunks, or every new token)."""
        prefix = [self.lens[c.seq] for c in chunks]
        top = max(slot(self.num_seqs, c.seq, p + len(c.ids) - 1) for c, p in zip(chunks, prefix))
        assert top < self.runner.kv_slots, "KV pool too small for this layout"
        fb = make_batch(chunks, prefix, self.num_seqs, sample_all, str(self.runner.device))
        for c in chunks:
            self.lens[c.seq] += len(c.ids)
        return self.runner.forward(fb)


def greedy(
    runner: ModelRunner,
    prompts: list[list[int]],
    new_tokens: int,
    forced: list[list[int] | None] | None = None,
) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy decoding of every prompt in one batch: argmax tokens `[P][new_tokens]` and the
    logits they were taken from, `[P, new_tokens, V]`.

    Each prompt is prefilled in two chunks (the second one reads the first from the pool,
    as a chunked or prefix-cached prefill does), then `new_tokens - 1` decode steps follow.
    A sequence with `forced[i]` set feeds those tokens instead of its own argmax (teacher
    forcing), so its logits compare position by position with the run that produced them.
    """
    forced = forced or [None] * len(prompts)
    assert all(len(p) >= 2 for p in prompts), "each prompt needs two chunks"
    driver = Driver(runner, len(prompts))
    driver.step([Chunk(s, p[: len(p) // 2], sample=False) for s, p in enumerate(prompts)])
    logits = driver.step([Chunk(s, p[len(p) // 2 :]) for s, p in enumerate(prompts)])  # [P, V]
    steps = [logits]
    for t in range(new_tokens - 1):
        top = logits.argmax(-1).tolist()  # [P]
        feed = [f[t] if f is not None else x for f, x in zip(forced, top)]
        # cloned: a CUDA-graph replay returns its output buffer, which the next one overwrites
        logits = driver.step([Chunk(s, [token]) for s, token in enumerate(feed)]).clone()
        steps.append(logits)  # [P, V]
    out = torch.stack(steps, 1)  # [P, new_tokens, V]
    return out.argmax(-1).tolist(), out


def assert_prefill_matches_hf(spec, hf, ids: list[int]) -> None:
    """One prefill of `ids` through a ModelRunner of `spec` (fp32, CPU) gives the logits of
    the transformers model `hf` at every position."""
    from runtime.worker.model_runner import ModelRunner

    runner = ModelRunner(spec, "cpu", torch.float32, kv_slots=len(ids) + 16, max_rows=1)
    logits = Driver(runner, 1).step([Chunk(0, ids)], sample_all=True)  # [T, V]
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(torch.tensor([ids])).logits[0],
                                   atol=1e-4, rtol=1e-4)
