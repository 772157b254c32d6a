"""SmolLM2-135M through ModelRunner against transformers: logits, and batched greedy decoding."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from runtime.model_config import ModelSpec, resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.model_runner import ModelRunner
from tests.e2e.hf_reference import shared_reference
from tests.worker.batching import Chunk, Driver

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker who had never once left the valley. One morning",
    "Hi",
]
NEW_TOKENS = 24
SPLIT_SEQ = 2  # this prompt arrives in two chunks: the second one has prefix_len > 0


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return resolve_model("smollm2")


@pytest.fixture(scope="module")
def hf():
    return shared_reference().model


@pytest.fixture(scope="module")
def prompts(spec) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(spec.path)
    return [tok(p)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def runner(spec) -> ModelRunner:
    return ModelRunner(spec, "cpu", torch.float32, kv_slots=1024, max_rows=8)


def test_runner_attributes(runner, spec):
    assert runner.vocab_size == 49152
    assert runner.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert runner.kv_slots == 1024 and runner.max_context == 1024
    assert runner.kv_pool.k[0].shape[0] == 1025  # slot 0 is the padding sink
    assert runner.sampler.vocab_size == runner.vocab_size


def test_prefill_logits_match_transformers(runner, hf, prompts):
    ids = prompts[2]
    logits = Driver(runner, 1).step([Chunk(0, ids)], sample_all=True)  # [n, V]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]  # [n, V]
    torch.testing.assert_close(logits, want, atol=1e-3, rtol=1e-4)


def test_batched_greedy_matches_generate(runner, hf, prompts, spec):
    """All prompts in one batch (one split in two chunks), then batched greedy decode."""
    sampler = runner.sampler
    for row in range(len(prompts)):
        sampler.init_row(row, SamplingParams(temperature=0.0))
    driver = Driver(runner, len(prompts))
    half = len(prompts[SPLIT_SEQ]) // 2
    out: list[list[int]] = [[] for _ in prompts]
    pending = {s: p for s, p in enumerate(prompts)}  # tokens to feed next
    pending[SPLIT_SEQ] = prompts[SPLIT_SEQ][:half]
    first_step = True
    while pending:
        chunks = [Chunk(s, ids, sample=not (first_step and s == SPLIT_SEQ))
                  for s, ids in pending.items()]
        logits = driver.step(chunks)  # [S, V]
        rows = [c.seq for c in chunks if c.sample]
        positions = [driver.lens[s] for s in rows]
        ids, _ = sampler.sample(logits, rows, positions)
        pending = {SPLIT_SEQ: prompts[SPLIT_SEQ][half:]} if first_step else {}
        first_step = False
        for s, token in zip(rows, ids.tolist()):
            out[s].append(token)
            if len(out[s]) < NEW_TOKENS:
                pending[s] = [token]
    for seq, ids in enumerate(prompts):
        with torch.no_grad():
            gen = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                              max_new_tokens=NEW_TOKENS, do_sample=False)
        want = gen[0, len(ids):].tolist()
        assert out[seq][:len(want)] == want, f"prompt {seq}"
        assert len(want) == NEW_TOKENS or want[-1] in spec.eos_token_ids
