"""What the load generator sends (datasets of token-id prompts) and when (arrival times).

Prompts are random token ids (>= 3, clear of bos/eos/unk), so they work for models without
a tokenizer (`dummy:` presets) and never hit the prefix cache by accident; each dataset
takes a seed, and runs that must not share prefixes use different seeds.

Datasets (`make_dataset(name, ...)`):
- `random`: input and output lengths uniform in [lo, hi].
- `fixed`: every request `input_len` in, `output_len` out.
- `mixed`: the seeds' load-test mix by total length: 30% short (32-511 tokens), 60% medium
  (512-2047), 10% long (2048-`max_len`). max_tokens = min(cap, length / 4) (at least 16),
  and the client stops reading after 25-100% of it (an early stop the server cannot
  foresee, like an EOS: variable-length streaming). Same mix as `bench/studies/fragmentation.py`.
- `long`: very long prompts (e.g. 32k) with short outputs: chunked prefill.
- `shared-prefix`: few-shot: `num_prefixes` system prompts of `prefix_len` tokens, each
  request one of them plus its own `suffix_len` tokens.

Arrivals (`arrival_times`): all at once (rate inf), Poisson (burstiness 1) or gamma
(burstiness k: shape k, same mean rate; < 1 is burstier), and bursts that multiply the rate
by `factor` for `seconds` starting at `at` (the seeds' "5x traffic within 2 s").
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MIN_TOKEN = 3
MIX = ((0.3, 32, 511), (0.6, 512, 2047), (0.1, 2048, None))  # share, min, max (None: max_len)


@dataclass(frozen=True)
class RequestSpec:
    """One request: its prompt, max_tokens, and where the client stops reading (None: at
    the server's end of the stream)."""

    prompt: list[int]
    max_tokens: int
    stop_after: int | None = None


@dataclass(frozen=True)
class Burst:
    at: float  # seconds after the start
    seconds: float
    factor: float

    @classmethod
    def parse(cls, text: str) -> Burst:
        """`AT:SECONDS:FACTOR`, e.g. `5:2:5` (5x the rate for 2 s from t = 5 s)."""
        at, seconds, factor = (float(x) for x in text.split(":"))
        return cls(at, seconds, factor)


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(MIN_TOKEN, vocab) for _ in range(n)]


def random_requests(n: int, input_len: tuple[int, int], output_len: tuple[int, int],
                    vocab: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    return [RequestSpec(_ids(rng, rng.randint(*input_len), vocab), rng.randint(*output_len))
            for _ in range(n)]


def mixed_requests(n: int, max_len: int, output_cap: int, vocab: int,
                   seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    specs = []
    for _ in range(n):
        _, lo, hi = rng.choices(MIX, weights=[m[0] for m in MIX])[0]
        length = rng.randint(min(lo, max_len - 1), min(hi or max_len, max_len))
        max_tokens = min(output_cap, max(16, length // 4), length - 1)
        stop = rng.randint(max(1, max_tokens // 4), max_tokens)
        specs.append(RequestSpec(_ids(rng, length - max_tokens, vocab), max_tokens,
                                 stop if stop < max_tokens else None))
    return specs


def shared_prefix_requests(n: int, num_prefixes: int, prefix_len: int, suffix_len: int,
                           output_len: int, vocab: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    prefixes = [_ids(rng, prefix_len, vocab) for _ in range(num_prefixes)]
    return [RequestSpec(prefixes[i % num_prefixes] + _ids(rng, suffix_len, vocab), output_len)
            for i in range(n)]


def make_dataset(name: str, n: int, vocab: int, seed: int, *, input_len: int = 1024,
                 output_len: int = 128, input_range: float = 0.0, max_len: int = 4096,
                 num_prefixes: int = 4, prefix_len: int = 1024) -> list[RequestSpec]:
    """`n` requests of dataset `name` (see the module docstring). `input_range` r makes
    `random` lengths uniform in [len * (1 - r), len * (1 + r)]."""
    if name in ("fixed", "long"):
        return random_requests(n, (input_len, input_len), (output_len, output_len), vocab, seed)
    if name == "random":
        lo = max(1, int(input_len * (1 - input_range)))
        hi = int(input_len * (1 + input_range))
        olo = max(1, int(output_len * (1 - input_range)))
        return random_requests(n, (lo, hi), (olo, int(output_len * (1 + input_range))),
                               vocab, seed)
    if name == "mixed":
        return mixed_requests(n, max_len, output_len, vocab, seed)
    if name == "shared-prefix":
        return shared_prefix_requests(n, num_prefixes, prefix_len, input_len, output_len,
                                      vocab, seed)
    raise ValueError(f"unknown dataset {name!r}; have {DATASETS}")


DATASETS = ("random", "fixed", "mixed", "long", "shared-prefix")


def arrival_times(n: int, rate: float, burstiness: float = 1.0,
                  bursts: tuple[Burst, ...] = (), seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of `n` requests at `rate` requests/s.

    Gaps are gamma(shape=burstiness, mean=1/current rate): Poisson when burstiness is 1.
    The current rate is `rate` times the factor of any burst covering the previous arrival.
    rate = inf sends everything at t = 0.
    """
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        now = rate * math.prod(b.factor for b in bursts if b.at <= t < b.at + b.seconds)
        t += rng.gammavariate(burstiness, 1.0 / (now * burstiness))
    return times
