"""Greedy outputs that may legitimately differ: only where the reference's top two logits
were a near-tie.

Two runs that add the same fp32 terms in another order (TP's partial sums, another GEMM
tiling) round differently by about 1e-6 of a logit's magnitude, so greedy decoding may pick
the other of two tokens whose logits were that close, and from there on the outputs
differ. Anything else is a bug. `NEAR_TIE` is the widest gap such rounding can bridge here,
with margin: logits of the tiny random models are O(0.1-1).
"""

from __future__ import annotations

import torch

NEAR_TIE = 1e-4


def near_tie_failures(got: list[list[int]], expected: list[list[int]],
                      logits: list[list[torch.Tensor]], tol: float = NEAR_TIE) -> list[str]:
    """Why `got` is not `expected` up to near-ties, one line per request that breaks the
    rule (empty: all is well). `logits[r][i]` is the reference's `[V]` logits when it chose
    `expected[r][i]`."""
    bad = []
    for r, (g, e) in enumerate(zip(got, expected)):
        if len(g) != len(e):
            bad.append(f"request {r}: {len(g)} tokens, expected {len(e)}")
            continue
        i = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), None)
        if i is None:
            continue
        gap = float(logits[r][i][e[i]] - logits[r][i][g[i]])
        if gap > tol:
            bad.append(f"request {r}: token {i} is {g[i]}, expected {e[i]}, whose logit "
                       f"led by {gap:.3g} (more than a near-tie, {tol})")
    return bad


def near_tie_failures_by_logprobs(got: list[list[int]], reference: list,
                                  tol: float = NEAR_TIE) -> list[str]:
    """`near_tie_failures` against reference `RequestOutput`s run with `top_logprobs` >= 2:
    at a first divergence the token taken must be among the reference's alternatives, its
    logprob within `tol` of the reference token's (a logprob gap is the logit gap)."""
    bad = []
    for r, (g, ref) in enumerate(zip(got, reference)):
        e = ref.token_ids
        i = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), None)
        if len(g) != len(e) or i is None:
            bad += [f"request {r}: {len(g)} tokens, expected {len(e)}"] if len(g) != len(e) else []
            continue
        alts = dict(ref.top(i))
        if g[i] not in alts or alts[e[i]] - alts[g[i]] > tol:
            bad.append(f"request {r}: token {i} is {g[i]}, expected {e[i]}; the reference's "
                       f"alternatives there: {ref.top(i)}")
    return bad
