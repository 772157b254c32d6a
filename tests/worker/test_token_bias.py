"""`logit_bias` and `allowed_token_ids` in the sampler, against a torch reference: greedy
and sampled choices, order before penalties, rows without them untouched, rebinding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.wire.sampling import SamplingParams
from runtime.worker.sampler import Sampler
from tests.worker.test_sampler import random_logits


def reference(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """`logits` [V] with `p`'s biases added and -inf outside its allowed tokens."""
    x = logits.clone()
    for token, bias in p.logit_bias.items():
        x[token] += bias
    if p.allowed_token_ids is not None:
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep[p.allowed_token_ids] = True
        x = x.masked_fill(~keep, float("-inf"))
    return x


ROWS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, logit_bias={7: 100.0}),
    SamplingParams(temperature=0.0, logit_bias={3: -100.0, 11: 2.5, 250: -0.75}),
    SamplingParams(temperature=0.0, allowed_token_ids=[4, 9, 9, 120]),
    SamplingParams(temperature=0.0, allowed_token_ids=[4, 9, 120], logit_bias={120: 3.0, 5: 50.0}),
    SamplingParams(temperature=0.0, logit_bias={}),
]  # fmt: skip


def test_greedy_choice_and_logprobs_match_the_reference():
    vocab = 300
    sampler = Sampler(8, vocab, "cpu")
    rows = [6, 0, 3, 1, 7, 2]  # table rows in no particular order
    for row, p in zip(rows, ROWS):
        sampler.init_row(row, p)
    for step in range(4):
        logits = random_logits(len(rows), vocab, seed=step)
        ids, logprobs = sampler.sample(logits, rows, [step] * len(rows))
        want = torch.stack([reference(logits[i], p) for i, p in enumerate(ROWS)]).argmax(-1)
        assert ids.tolist() == want.tolist()
        assert ids[1] == 7 and ids[3] in (4, 9, 120) and ids[4] in (4, 9, 120)
        # logprobs stay those of the raw logits
        raw = torch.log_softmax(logits, -1).gather(1, ids[:, None])[:, 0]
        torch.testing.assert_close(logprobs, raw)


def test_minus_100_bans_the_greedy_token_for_the_runner_up():
    sampler = Sampler(1, 50, "cpu")
    logits = random_logits(1, 50, seed=3)
    first, second = logits[0].topk(2).indices.tolist()
    sampler.init_row(0, SamplingParams(temperature=0.0, logit_bias={first: -100.0}))
    assert sampler.sample(logits, [0], [0])[0].tolist() == [second]


@pytest.mark.parametrize("seeded", [False, True])
def test_sampled_rows_draw_from_the_biased_allowed_distribution(seeded):
    rows, vocab = 6000, 8
    logits = torch.tensor([1.0, 0.2, 2.0, -1.0, 1.5, 0.0, 3.0, -0.5])
    params = dict(temperature=0.9, allowed_token_ids=[0, 1, 3, 4, 7],
                  logit_bias={1: 1.5, 4: -1.0, 6: 100.0})
    sampler = Sampler(rows, vocab, "cpu", seed=1)
    for row in range(rows):
        sampler.init_row(row, SamplingParams(**params, seed=row if seeded else None))
    ids, _ = sampler.sample(logits.expand(rows, vocab).contiguous(), list(range(rows)),
                            [5] * rows)
    freq = torch.bincount(ids, minlength=vocab) / rows
    want = torch.softmax(reference(logits, SamplingParams(**params)) / 0.9, -1)
    assert (freq[want == 0] == 0).all()  # token 6, forced by +100, is not allowed
    torch.testing.assert_close(freq, want, atol=0.025, rtol=0)


def test_bias_is_added_before_penalties():
    """Token 1 (logit 2, seen in the prompt) biased by -4 then penalized x2 is -4, below
    token 2's -3.5; penalized first (2 / 2 - 4 = -3) it would win."""
    sampler = Sampler(1, 4, "cpu")
    sampler.init_row(0, SamplingParams(temperature=0.0, repetition_penalty=2.0,
                                       logit_bias={1: -4.0}), prompt_ids=[1])
    logits = torch.tensor([[-10.0, 2.0, -3.5, -10.0]])
    assert sampler.sample(logits, [0], [0])[0].tolist() == [2]


def test_rows_without_bias_sample_as_in_a_batch_without_any():
    vocab, steps = 500, 6
    plain = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=5),
             SamplingParams(temperature=1.0, top_p=0.9, seed=9, frequency_penalty=0.5)]
    biased = [SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in range(250)}),
              SamplingParams(temperature=0.7, allowed_token_ids=[1, 2, 3], seed=4)]
    alone = Sampler(3, vocab, "cpu")
    mixed = Sampler(8, vocab, "cpu")
    for row, p in enumerate(plain):
        alone.init_row(row, p)
        mixed.init_row(row, p)
    for row, p in zip((5, 6), biased):
        mixed.init_row(row, p)
    for step in range(steps):
        logits = random_logits(5, vocab, seed=10 + step)  # rows 0-2: the plain requests'
        want, want_lp = alone.sample(logits[:3], [0, 1, 2], [step] * 3)
        ids, lps = mixed.sample(logits[[3, 0, 1, 4, 2]], [5, 0, 1, 6, 2], [step] * 5)
        assert ids[[1, 2, 4]].tolist() == want.tolist()
        assert torch.equal(lps[[1, 2, 4]], want_lp)
        assert ids[0] >= 250 and ids[3] in (1, 2, 3)


def test_no_table_until_a_row_sets_one_and_rebinding_clears_a_row():
    sampler = Sampler(4, 64, "cpu")
    sampler.init_row(0, SamplingParams(temperature=0.0))
    logits = random_logits(2, 64)
    assert sampler.bias.table is None
    assert sampler.bias.apply(logits, np.array([0, 1]), torch.tensor([0, 1])) is logits
    sampler.init_row(1, SamplingParams(temperature=0.0, allowed_token_ids=[9]))
    assert sampler.sample(logits, [0, 1], [0, 0])[0].tolist() == [logits[0].argmax(), 9]
    sampler.init_row(1, SamplingParams(temperature=0.0))  # the row goes to a plain request
    assert not sampler.bias.table[1].any()
    assert sampler.sample(logits, [0, 1], [0, 0])[0].tolist() == logits.argmax(-1).tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_step_with_biased_rows_never_syncs_with_the_host():
    vocab = 1000
    sampler = Sampler(4, vocab, "cuda")
    for row, p in enumerate(ROWS[:4]):
        sampler.init_row(row, p)
    logits = random_logits(4, vocab).cuda()
    rows = torch.arange(4, device="cuda")
    sampler.sample(logits, [0, 1, 2, 3], torch.zeros(4, dtype=torch.int64, device="cuda"),
                   rows_dev=rows, all_logprobs=False)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, _ = sampler.sample(logits, [0, 1, 2, 3],
                                torch.zeros(4, dtype=torch.int64, device="cuda"),
                                rows_dev=rows, all_logprobs=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = torch.stack([reference(logits[i].cpu(), p) for i, p in enumerate(ROWS[:4])])
    assert ids.tolist() == want.argmax(-1).tolist()
