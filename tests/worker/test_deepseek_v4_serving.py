"""DeepSeek-V4 served by the scheduler and the worker in one process (a tiny random
checkpoint, fp32 on the CPU: window 8, CSA entries every 4 tokens, HCA every 8), against
transformers' greedy tokens. The partial blocks live in rings per request row, so prefix
hits are rounded down to a multiple of 8 and their last CSA window (4 tokens) is computed
again: a hit that ends mid-block, one that ends inside the window after a CSA overlap and
an aligned one; a retracted and re-admitted request (whose re-admission hits its own
prefix); a prefill in chunks that start and end inside blocks."""

from __future__ import annotations

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.worker import Worker
from tests.worker.dsv4_checkpoints import tiny_v4
from tests.worker.in_process import run_to_end

NEW_TOKENS = 5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(folder, transformers model) of the tiny checkpoint."""
    folder = tmp_path_factory.mktemp("dsv4")
    return str(folder), tiny_v4(folder)


def hf_greedy(hf, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    """transformers' greedy continuation of `prompt`, `n` tokens."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def serve_waves(cfg: ServerConfig, waves: list[list[list[int]]]):
    """Serve each wave's prompts together, a wave once the one before has ended (so its
    prefixes are cached): (outputs, cached prompt tokens) per prompt, and the scheduler."""
    spec = resolve_model(cfg.model)
    worker = Worker(cfg, spec)
    sched = build_scheduler(cfg, worker.ready_message(), spec.max_context)
    outs, cached = {}, {}
    for w, prompts in enumerate(waves):
        rids = [f"w{w}r{i}" for i in range(len(prompts))]
        for rid, prompt in zip(rids, prompts):
            sched.add(GenerateReq(rid, prompt, SamplingParams(max_tokens=NEW_TOKENS,
                                                              temperature=0.0)))
            outs[rid], cached[rid] = [], 0
        run_to_end(sched, worker, outs, cached)
    return list(outs.values()), list(cached.values()), sched


def config(folder: str, **options) -> ServerConfig:
    base = dict(model=folder, device="cpu", dtype="float32", kv_slots=511, max_running=8,
                chunk_size=64, torch_threads=1, log_level="warning")
    return ServerConfig(**{**base, **options})


def prompts_of(seed: int, *lens: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lens]


@pytest.mark.parametrize("kv", [dict(kv="token"), dict(kv="paged", block_size="4")])
def test_prefix_hits_anywhere_give_the_tokens_of_no_hit(checkpoint, kv):
    """Prompts sharing the first 13 (mid-block), 17 (inside the window after the overlap
    window [12, 16)) and 24 (aligned) tokens of a served one hit 8, 16 and 24 tokens, and
    continue as transformers does without any cache."""
    folder, hf = checkpoint
    first, *tails = prompts_of(3, 40, 9, 6, 11)
    shared = [first[:13] + tails[0], first[:17] + tails[1], first[:24] + tails[2]]
    outs, cached, _ = serve_waves(config(folder, **kv), [[first], shared])
    assert cached == [0, 8, 16, 24]
    assert outs == [hf_greedy(hf, p) for p in [first, *shared]]


def test_retracted_requests_give_the_tokens_of_unretracted_ones(checkpoint):
    """A pool too small for the batch retracts requests mid-decode; re-admitted, they hit
    their own cached prefix (aligned, its last CSA window again) and end as transformers
    does."""
    folder, hf = checkpoint
    prompts = prompts_of(4, 27, 30, 22, 35, 29, 25)
    cfg = config(folder, kv_slots=150, schedule_conservativeness=0.0)
    outs, _, sched = serve_waves(cfg, [prompts])
    assert sched.num_retractions > 0  # the pool really was too small for the batch
    assert outs == [hf_greedy(hf, p) for p in prompts]


def test_chunked_prefill_across_block_boundaries(checkpoint):
    """Chunks of 5 tokens start and end inside CSA windows and HCA blocks: each chunk
    closes windows from the inputs the one before left in the row's ring."""
    folder, hf = checkpoint
    prompts = prompts_of(5, 37, 23)
    outs, _, _ = serve_waves(config(folder, chunk_size=5), [prompts])
    assert outs == [hf_greedy(hf, p) for p in prompts]
