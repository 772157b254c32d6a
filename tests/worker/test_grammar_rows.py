"""Grammar masks on the worker (regex keys): per-row matchers, replay on re-admission, the
sampler's mask, compiles ahead of the step and eviction from the compiled cache."""

from __future__ import annotations

import gc
import queue
import re

import pytest
import torch

from runtime.grammar import GrammarCompiler
from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.grammar_rows import GrammarRows
from runtime.worker.sampler import Sampler

DATE = "regex:" + r"\d{4}-\d{2}-\d{2}"  # a grammar key


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    spec = resolve_model("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path)
    vocab = spec.hf_config().vocab_size
    compiler = GrammarCompiler(spec.tokenizer_path, vocab, list(spec.eos_token_ids))
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


def prepare_and_wait(g: GrammarRows, regex: str) -> str | None:
    """Ask `g` to compile `regex` ahead; the error its report carries (None: ready)."""
    reports: queue.SimpleQueue = queue.SimpleQueue()
    g.prepare([regex], lambda rx, error: reports.put((rx, error)))
    rx, error = reports.get(timeout=120)
    assert rx == regex
    return error


def test_a_row_bound_to_a_prepared_regex_never_waits_for_a_compile(smollm2):
    tokenizer, *_ = smollm2
    g = rows_for(smollm2)
    g.init_row(0, "regex:" + r"[a-z]{3}-\d{5}", [])  # not prepared: this step waits for the compile
    assert g.compile_waits == 1
    assert prepare_and_wait(g, "regex:" + r"[a-z]{2}_\d{6}") is None
    g.init_row(1, "regex:" + r"[a-z]{2}_\d{6}", [])
    assert g.compile_waits == 1
    first = allowed_texts(tokenizer, g.allowed([1])[0])
    assert first and all(re.fullmatch(r"[a-z]{1,2}", t) for t in first), first


def test_eviction_leaves_a_live_row_working(smollm2):
    tokenizer, vocab, eos, _ = smollm2
    spec = resolve_model("smollm2")
    compiler = GrammarCompiler(spec.tokenizer_path, vocab, eos)
    g = GrammarRows(compiler, vocab, eos, torch.device("cpu"))
    try:
        assert prepare_and_wait(g, DATE) is None
        assert len(compiler) == 1
        g.init_row(2, DATE, ids_of(tokenizer, "2024-"))
        g.evict([DATE])
        gc.collect()
        assert len(compiler) == 0 and g.compile_waits == 0
        for tok in ids_of(tokenizer, "01-15"):
            assert g.allowed([2])[0, tok], tokenizer.decode([tok])
            g.advance([2], torch.tensor([tok]))
        assert g.allowed([2])[0].nonzero()[:, 0].tolist() == eos
        g.init_row(3, DATE, [])  # evicted for real: a new row compiles it again
        assert g.compile_waits == 1 and len(compiler) == 1
    finally:
        compiler.close()


def test_a_compile_that_fails_is_reported_not_raised(smollm2):
    _, vocab, eos, _ = smollm2
    broken = GrammarCompiler("/nonexistent/tokenizer", vocab, eos)
    try:
        error = prepare_and_wait(GrammarRows(broken, vocab, eos, torch.device("cpu")), DATE)
        assert error is not None and error.startswith("grammar compilation failed")
    finally:
        broken.close()
    without_tokenizer = GrammarRows(None, vocab, eos, torch.device("cpu"))
    assert "tokenizer" in prepare_and_wait(without_tokenizer, DATE)
