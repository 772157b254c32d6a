"""Rejection sampling of draft tokens from a draft distribution (exact speculative sampling).

A draft model proposes token x_i with probability q_i(x_i); the target's distribution at
the same position is p_i. Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection, emit a sample of the residual max(p_i - q_i, 0) (normalized) instead and
stop; when every draft is accepted, emit a sample of the target's next distribution. Each
emitted token is then distributed exactly as the target's own sample, whatever q is.

A deterministic proposer (prompt lookup, a replayed continuation) is the case q = one-hot:
acceptance becomes p(x), and the residual is p without x, renormalized, which is what
comparing the target's own sample with the draft gives, and what the runtime does for
every proposer it has (`runtime.scheduler.speculative.speculation`), since they all draft
deterministically. This general form, for drafts with a full distribution, is the exact
reference of `bench.studies.speculative_cosine`. Everything stays on the device.
"""

from __future__ import annotations

import torch


def rejection_sample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     uniform: torch.Tensor, generator: torch.Generator | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify `drafts` [B, k] (drawn from `q` [B, k, V]) against the target `p`
    [B, k + 1, V] (its distributions after each prefix of the drafts, the last one after
    all of them). `uniform` [B, k] holds U[0, 1) draws for the acceptance tests.

    Returns (tokens [B, k + 1] int64, counts [B] int64): row b's output is
    tokens[b, :counts[b]], its accepted drafts followed by one corrected or bonus token.
    """
    b, k = drafts.shape
    p_draft = p[:, :k].gather(2, drafts[..., None])[..., 0]  # [B, k]
    q_draft = q.gather(2, drafts[..., None])[..., 0]  # [B, k]
    accept = uniform * q_draft < p_draft  # [B, k]: u < p/q without dividing by zero
    # accepted drafts before the first rejection
    m = torch.cumprod(accept.long(), dim=1).sum(dim=1)  # [B]
    rows = torch.arange(b, device=p.device)  # [B]
    target = p[rows, m]  # [B, V]: p after the accepted drafts
    rejected = m < k  # [B]
    q_at = q[rows, m.clamp(max=k - 1)] * rejected[:, None]  # [B, V]; zero when all accepted
    residual = (target - q_at).clamp_min(0)  # [B, V]
    # p == q exactly leaves no residual mass; then any draw of p is right
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target)  # [B, V]
    last = torch.multinomial(residual, 1, generator=generator)[:, 0]  # [B]
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)  # [B, k + 1]
    tokens[rows, m] = last
    return tokens, m + 1

