"""Test helper: prompts sharing a prefix (so a second pass hits the radix cache), and
their greedy tokens from an Engine with its pool checked empty and consistent after."""

from __future__ import annotations

import torch

from runtime import Engine, SamplingParams


def shared_prefix_prompts(seed: int, vocab: int, shared: int,
                          tails: tuple[int, ...]) -> list[list[int]]:
    """One random prefix of `shared` ids in [3, vocab), then a random tail of each length."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, vocab, (shared,), generator=gen).tolist()
    return [prefix + torch.randint(3, vocab, (n,), generator=gen).tolist() for n in tails]


def greedy_tokens(eng: Engine, prompts: list[list[int]],
                  params: SamplingParams) -> list[list[int]]:
    """Each prompt's generated ids; the pool is empty and its allocator consistent after."""
    outs = eng.generate(prompts, params)
    stats = eng.stats()
    assert stats.invariant_error is None and stats.kv_used == 0
    return [o.token_ids for o in outs]
