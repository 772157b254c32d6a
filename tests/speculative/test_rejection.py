"""Rejection sampling keeps the target's distribution; the cosine rule does not.

A bigram model over 6 tokens is the target, its noisy copy the draft; the first two
output tokens of many verify steps are compared with the target's exact joint
distribution by a chi-square test (`bench.studies.speculative_cosine`).
"""

from __future__ import annotations

import torch

from bench.studies.rejection import rejection_sample
from bench.studies.speculative_cosine import (
    bigram_models,
    chi_square_pvalue,
    first_two_counts,
    target_joint,
)

TRIALS = 60_000


def test_rejection_sampling_keeps_the_target_distribution():
    p, q = bigram_models()
    joint, tokens_per_step = first_two_counts(p, q, "rejection", TRIALS)
    _, pvalue = chi_square_pvalue(joint, target_joint(p))
    assert pvalue > 1e-3  # a fixed seed: this is one fixed draw, not a flaky test
    assert tokens_per_step > 2.5  # a close draft is mostly accepted


def test_the_cosine_rule_changes_the_distribution():
    p, q = bigram_models()
    joint, _ = first_two_counts(p, q, "cosine", TRIALS)
    _, pvalue = chi_square_pvalue(joint, target_joint(p))
    assert pvalue < 1e-12


def test_a_draft_equal_to_the_target_is_always_accepted_and_a_zero_probability_one_never():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]])  # [1, 3, 3]
    drafts = torch.tensor([[1, 2]])
    tokens, counts = rejection_sample(p, p[:, :2], drafts, torch.full((1, 2), 0.999))
    assert counts.tolist() == [3] and tokens.tolist() == [[1, 2, 0]]  # bonus: p's only token
    q = torch.tensor([[[0.0, 0.0, 1.0], [0.2, 0.3, 0.5]]])  # drafts token 2 where p(2) = 0
    tokens, counts = rejection_sample(p, q, torch.tensor([[2, 2]]), torch.zeros(1, 2))
    assert counts.tolist() == [1] and tokens[0, 0] in (0, 1)  # resampled from p - q
