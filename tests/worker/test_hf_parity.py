"""Loader + model against transformers, on tiny random checkpoints of each supported family."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.model_config import resolve_model
from runtime.worker.loader import load_model
from runtime.worker.model_runner import ModelRunner
from tests.worker.batching import Chunk, Driver
from tests.worker.checkpoints import BASE, FAMILIES, tiny_checkpoint

# chunk sizes of each sequence per step: extend, extend after a prefix, then decode steps
SCHEDULE = [[25, 10, 1, 1], [12] + [1] * 8]


def run_schedule(runner: ModelRunner, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Feed `seqs` in the chunks of SCHEDULE, batched; logits of every position per seq."""
    driver = Driver(runner, len(seqs))
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in range(max(len(s) for s in SCHEDULE)):
        chunks = []
        for seq, sizes in enumerate(SCHEDULE):
            if step < len(sizes):
                start = sum(sizes[:step])
                chunks.append(Chunk(seq, seqs[seq][start : start + sizes[step]]))
        logits = driver.step(chunks, sample_all=True)  # [T, V]
        for chunk, part in zip(chunks, logits.split([len(c.ids) for c in chunks])):
            out[chunk.seq].append(part)
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_matches_transformers(family, tmp_path):
    hf = tiny_checkpoint(family, tmp_path)
    runner = ModelRunner(
        resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=128, max_rows=4
    )
    gen = torch.Generator().manual_seed(1)
    seqs = [
        torch.randint(0, BASE["vocab_size"], (sum(s),), generator=gen).tolist() for s in SCHEDULE
    ]
    ours = run_schedule(runner, seqs)
    with torch.no_grad():
        for seq, got in zip(seqs, ours):
            want = hf(torch.tensor([seq])).logits[0]  # [n, V]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_dummy_is_seeded_and_matches_transformers():
    spec = resolve_model("dummy:tiny")
    model = load_model(spec, "cpu", torch.float32, seed=3)
    again = load_model(spec, "cpu", torch.float32, seed=3)
    other = load_model(spec, "cpu", torch.float32, seed=4)
    params = dict(model.named_parameters())
    for name, param in again.named_parameters():
        assert torch.equal(param, params[name]), name
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert not torch.equal(params[qkv], dict(other.named_parameters())[qkv])
    assert torch.equal(params["model.norm.weight"], torch.ones(spec.hf_config().hidden_size))
    assert abs(params[qkv].std().item() - 0.02) < 0.002
    # the same weights in a transformers model give the same logits
    hf = AutoModelForCausalLM.from_config(spec.hf_config(), dtype=torch.float32).eval()
    state = {
        name: params[p].narrow(0, start, rows)
        for name, (p, start, rows) in model.checkpoint_targets().items()
    }
    hf.load_state_dict(state, strict=True)
    runner = ModelRunner(spec, "cpu", torch.float32, kv_slots=64, max_rows=2, seed=3)
    ids = torch.randint(0, 1024, (1, 19), generator=torch.Generator().manual_seed(2))
    logits = Driver(runner, 1).step([Chunk(0, ids[0].tolist())], sample_all=True)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(ids).logits[0], atol=1e-4, rtol=1e-4)
