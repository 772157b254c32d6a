"""Sampler: greedy, truncation, distributions, seeds, penalties and logprobs."""

from __future__ import annotations

import pytest
import torch

from runtime.wire.sampling import SamplingParams
from runtime.worker.sampler import Sampler

GREEDY = SamplingParams(temperature=0.0)


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def bind(sampler: Sampler, params: list[SamplingParams], **kw) -> list[int]:
    for row, p in enumerate(params):
        sampler.init_row(row, p, **kw)
    return list(range(len(params)))


def test_greedy_is_argmax_lowest_index_on_ties():
    sampler = Sampler(4, 50, "cpu")
    logits = random_logits(4, 50)
    logits[1, 3] = logits[1, 17] = logits[1].max() + 1
    ids, _ = sampler.sample(logits, bind(sampler, [GREEDY] * 4), [5] * 4)
    assert ids.tolist() == logits.argmax(-1).tolist() and ids[1] == 3


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.5, top_k=1),
    SamplingParams(temperature=1.5, top_p=1e-6),
    SamplingParams(temperature=1.5, min_p=1.0),
    SamplingParams(temperature=1.5, top_k=1, seed=9),
])
def test_truncation_to_one_token_is_greedy(params):
    sampler = Sampler(8, 100, "cpu")
    rows = bind(sampler, [params] * 8)
    for step in range(5):
        logits = random_logits(8, 100, seed=step)
        ids, _ = sampler.sample(logits, rows, [step] * 8)
        assert ids.tolist() == logits.argmax(-1).tolist()


def expected_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Reference: temperature, top-k, renormalize, top-p (smallest set reaching p), min-p."""
    probs = torch.softmax(logits / p.temperature, -1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    k = p.top_k if p.top_k > 0 else len(probs)
    mass, total = 0.0, probs[order[:k]].sum()
    for token in order[:k].tolist():
        if p.top_p < 1 and mass >= p.top_p:
            break
        keep[token] = True
        mass += (probs[token] / total).item()
    keep &= probs >= p.min_p * probs.max()
    return torch.where(keep, probs, 0) / torch.where(keep, probs, 0).sum()


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=2.0),
    SamplingParams(temperature=0.8, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.7),
    SamplingParams(temperature=1.0, min_p=0.2),
    SamplingParams(temperature=1.3, top_k=4, top_p=0.8),
])
def test_sample_distribution(params, seeded):
    rows, vocab = 6000, 6
    logits = torch.tensor([1.0, 0.2, 2.0, -1.0, 1.5, 0.0])
    sampler = Sampler(rows, vocab, "cpu", seed=1)
    for row in range(rows):  # seeded: every row its own seed, so rows are independent draws
        seed = row if seeded else None
        sampler.init_row(row, SamplingParams(**{**_fields(params), "seed": seed}))
    ids, _ = sampler.sample(logits.expand(rows, vocab).contiguous(), list(range(rows)),
                            [3] * rows)
    freq = torch.bincount(ids, minlength=vocab) / rows
    want = expected_probs(logits, params)
    assert (freq[want == 0] == 0).all()
    torch.testing.assert_close(freq, want, atol=0.025, rtol=0)


def _fields(p: SamplingParams) -> dict:
    return {f: getattr(p, f) for f in p.__struct_fields__}


def test_seed_is_independent_of_batch_composition():
    vocab, steps = 1000, 12
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=123)
    alone = Sampler(4, vocab, "cpu", seed=0)
    alone.init_row(0, seeded)
    crowd = Sampler(8, vocab, "cpu", seed=77)
    for row, p in [(2, SamplingParams(temperature=1.0)), (5, seeded), (0, GREEDY),
                   (3, SamplingParams(temperature=0.5, seed=7))]:
        crowd.init_row(row, p)
    other_seed = Sampler(4, vocab, "cpu")
    other_seed.init_row(0, SamplingParams(temperature=1.0, top_p=0.95, seed=124))
    got_alone, got_crowd, got_other = [], [], []
    for step in range(steps):
        logits = random_logits(4, vocab, seed=step)  # row 1 is the seeded request's
        pos = 40 + step
        got_alone.append(alone.sample(logits[1:2], [0], [pos])[0].item())
        got_other.append(other_seed.sample(logits[1:2], [0], [pos])[0].item())
        ids, _ = crowd.sample(logits, torch.tensor([2, 5, 0, 3]), [7, pos, 9, 11])
        got_crowd.append(ids[1].item())
    assert got_alone == got_crowd
    assert got_alone != got_other


def test_penalties_match_hand_reference():
    sampler = Sampler(3, 6, "cpu")
    penalized = SamplingParams(temperature=0.0, repetition_penalty=2.0,
                               frequency_penalty=0.5, presence_penalty=0.25)
    sampler.init_row(0, GREEDY)
    sampler.init_row(2, penalized, prompt_ids=[1, 2], output_ids=[2, 3, 3])
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -0.5, 1.0]] * 2)
    got = sampler.apply_penalties(logits, torch.tensor([2, 0]))
    # tokens 1, 2, 3 seen (prompt or output): x / 2 if x > 0 else x * 2;
    # then output counts {2: 1, 3: 2}: x - 0.5 * count - 0.25
    want = [2.0, -2.0, 0.25 - 0.5 - 0.25, 1.5 - 1.0 - 0.25, -0.5, 1.0]
    torch.testing.assert_close(got[0], torch.tensor(want))
    torch.testing.assert_close(got[1], logits[1])  # row without penalties is untouched


def test_penalty_counts_follow_sampled_tokens():
    sampler = Sampler(2, 4, "cpu")
    presence = SamplingParams(temperature=0.0, presence_penalty=1.5)
    sampler.init_row(1, presence)
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]])
    picks = [sampler.sample(logits, [1], [i])[0].item() for i in range(3)]
    assert picks == [1, 2, 1]  # 3.0 | 3.0-1.5 < 2.0 | 1.5 > 2.0-1.5 and > 1.0
    sampler.init_row(1, presence)  # rebinding resets the counts
    assert sampler.sample(logits, [1], [0])[0].item() == 1
    sampler.init_row(1, presence, output_ids=[1])  # re-admission restores them
    assert sampler.sample(logits, [1], [0])[0].item() == 2


def test_logprobs_are_log_softmax_of_raw_logits():
    sampler = Sampler(4, 64, "cpu")
    rows = bind(sampler, [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=0.0, repetition_penalty=1.3),
        SamplingParams(temperature=1.2, frequency_penalty=1.0, seed=5),
        SamplingParams(temperature=0.9, min_p=0.1, presence_penalty=0.5),
    ], prompt_ids=[1, 2, 3], output_ids=[4, 4])
    logits = random_logits(4, 64)
    ids, logprobs = sampler.sample(logits, rows, [10] * 4)
    want = torch.log_softmax(logits, -1).gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(logprobs, want)
    assert logprobs.dtype == torch.float32 and ids.dtype == torch.int64
