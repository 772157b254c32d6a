"""Regex masks on the worker: per-row matchers, replay on re-admission, the sampler's mask."""

from __future__ import annotations

import re

import pytest
import torch

from runtime.grammar import RegexCompiler
from runtime.messages import SamplingParams
from runtime.model_config import resolve_model
from runtime.worker.grammar_rows import GrammarRows
from runtime.worker.sampler import Sampler

DATE = r"\d{4}-\d{2}-\d{2}"


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    spec = resolve_model("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path)
    vocab = spec.hf_config().vocab_size
    compiler = RegexCompiler(spec.tokenizer_path, vocab, list(spec.eos_token_ids))
    yield tokenizer, vocab, list(spec.eos_token_ids), compiler
    compiler.close()


def rows_for(smollm2) -> GrammarRows:
    _, vocab, eos, compiler = smollm2
    return GrammarRows(compiler, vocab, eos, torch.device("cpu"))


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def allowed_texts(tokenizer, mask: torch.Tensor) -> set[str]:
    return {tokenizer.decode([t]) for t in mask.nonzero()[:, 0].tolist()}


def test_mask_follows_the_regex_and_ends_with_eos_only(smollm2):
    tokenizer, vocab, eos, _ = smollm2
    g = rows_for(smollm2)
    g.init_row(3, DATE, [])
    g.init_row(5, None, [])
    mask = g.allowed([3, 5])  # [2, V]
    assert mask.shape == (2, vocab) and mask[1].all()
    first = allowed_texts(tokenizer, mask[0])
    assert first and all(re.fullmatch(r"\d{1,4}", t) for t in first), first
    for tok in ids_of(tokenizer, "2024-01-15"):
        assert g.allowed([3])[0, tok], tokenizer.decode([tok])
        g.advance([3], torch.tensor([tok]))
    done = g.allowed([3])[0]
    assert done.nonzero()[:, 0].tolist() == eos  # complete: only EOS may follow
    g.advance([3], torch.tensor([eos[0]]))
    assert g.allowed([3])[0].nonzero()[:, 0].tolist() == eos  # terminated: still EOS only
    assert g.allowed([5]) is None  # no constrained row: no mask at all


def test_reinit_replays_outputs_and_unbinds_the_old_request(smollm2):
    tokenizer, *_ = smollm2
    g = rows_for(smollm2)
    g.init_row(0, DATE, ids_of(tokenizer, "1999-"))  # re-admitted after "1999-"
    after_dash = allowed_texts(tokenizer, g.allowed([0])[0])
    assert after_dash and all(re.fullmatch(r"\d{1,2}", t) for t in after_dash), after_dash
    g.init_row(0, None, [])  # the row goes to an unconstrained request
    assert g.allowed([0]) is None


def test_sampler_draws_only_allowed_tokens():
    sampler = Sampler(2, 64, "cpu")
    for row, p in enumerate([SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)]):
        sampler.init_row(row, p)
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(0)) * 3
    allowed = torch.zeros(2, 64, dtype=torch.bool)
    allowed[:, [5, 17, 40]] = True
    seen = set()
    for _ in range(60):
        ids, lps = sampler.sample(logits, [0, 1], [7, 7], allowed)
        seen.add(int(ids[0]))
        assert int(ids[1]) == [5, 17, 40][int(logits[1, [5, 17, 40]].argmax())]
        # logprobs stay those of the raw distribution
        assert torch.allclose(lps, torch.log_softmax(logits, -1).gather(1, ids[:, None])[:, 0])
    assert seen <= {5, 17, 40} and len(seen) > 1
