"""The workloads both engines run: groups of rows, one model shape per group.

A group is one model started once per engine (an offline engine, or a server) and every row
of it run `repeats` times against that one instance. The shapes are Sluice's `dummy:`
presets; the peer loads a folder holding only that preset's config.json (random weights).

| group | model | rows |
|---|---|---|
| offline-7b | llama-7b (Llama-2-7B shape) | batch 1 x 512/256, 64 x 512/128, 512 x 512/128 |
| offline-8b | llama3-8b (Llama-3-8B shape) | the same |
| served | llama3-8b | concurrency 16, 64, 256 of 512/128 requests |
| multiturn | llama3-8b | 200 chats x 6 turns (256 user + 128 reply tokens a turn), concurrency 64 |
| long | llama-7b-32k | 2 x 32,000/128 and 16 x 8,192/128 |
| deepseek | deepseek-v2-lite (MLA + MoE) | batch 1 x 512/256, 64 x 512/128 |

`--tiny` swaps in the `*-tiny` groups (`dummy:tiny`, a few tokens): they run on the CPU.
Prompts are random token ids from a seeded generator (`prompts`): both engines get the same
ones, and every repeat its own, so no run hits the prefix cache of an earlier one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.serving.data import random_requests

WARMUP_SEED = 10_000  # the warm-up's prompts, apart from every timed repeat's


@dataclass(frozen=True)
class Row:
    """One workload. Offline: `batch` prompts at once. Served: `batch` is the concurrency
    and `requests` the requests of a run. Multi-turn: `requests` chats of `turns` turns,
    `input_len` new user tokens and `output_len` reply tokens a turn."""

    name: str
    batch: int
    input_len: int
    output_len: int
    requests: int = 0
    turns: int = 0


@dataclass(frozen=True)
class Group:
    name: str
    kind: str  # offline | served | multiturn
    preset: str  # Sluice's dummy preset; the peer's config.json is the same config
    rows: tuple[Row, ...]
    headline: str = "out_tok_s"  # the metric of the main table (higher is better)
    timeout_s: float = 900.0  # one engine's whole group, start-up included

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Group:
        return cls(**{**d, "rows": tuple(Row(**r) for r in d["rows"])})


def _offline(prefix: str, batches: tuple[int, ...]) -> tuple[Row, ...]:
    return tuple(Row(f"{prefix} batch {b}, 512/{256 if b == 1 else 128}", b, 512,
                     256 if b == 1 else 128) for b in batches)


# served requests per run: c16 10 waves, c64 8, c256 3 (each run ~10-15 s on an H200)
SERVED = tuple(Row(f"served c{c}, 512/128", c, 512, 128, requests=n)
               for c, n in ((16, 160), (64, 512), (256, 768)))

GROUPS = {g.name: g for g in (
    Group("offline-7b", "offline", "llama-7b", _offline("7B", (1, 64, 512))),
    Group("offline-8b", "offline", "llama3-8b", _offline("8B", (1, 64, 512))),
    Group("served", "served", "llama3-8b", SERVED),
    Group("multiturn", "multiturn", "llama3-8b",
          (Row("multi-turn 200 chats x 6, c64", 64, 256, 128, requests=200, turns=6),)),
    Group("long", "offline", "llama-7b-32k",
          (Row("long 2 x 32k/128", 2, 32000, 128), Row("long 16 x 8k/128", 16, 8192, 128)),
          headline="total_tok_s"),
    Group("deepseek", "offline", "deepseek-v2-lite", _offline("DeepSeek-V2-Lite", (1, 64))),
    # CPU-sized: they prove the harness works, never a performance number
    Group("offline-tiny", "offline", "tiny",
          (Row("tiny batch 1, 16/4", 1, 16, 4), Row("tiny batch 4, 16/4", 4, 16, 4)),
          timeout_s=240.0),
    Group("served-tiny", "served", "tiny", (Row("served-tiny c2, 16/4", 2, 16, 4, requests=6),),
          timeout_s=240.0),
    Group("multiturn-tiny", "multiturn", "tiny",
          (Row("multi-turn-tiny 4 chats x 2, c4", 4, 16, 4, requests=4, turns=2),),
          timeout_s=240.0),
)}  # fmt: skip
FULL = ("offline-7b", "offline-8b", "served", "multiturn", "long", "deepseek")
TINY = ("offline-tiny", "served-tiny", "multiturn-tiny")


def vocab_size(preset: str) -> int:
    from runtime.model_presets import DUMMY_PRESETS

    return DUMMY_PRESETS[preset]["vocab_size"]


def prompts(group: Group, row: Row, repeat: int) -> list[list[int]]:
    """The token-id prompts of `row`'s timed run `repeat` (0, 1, ...)."""
    return _prompts(group, row.batch, row.input_len, repeat * 1_000_003 + row.batch * 1009
                    + row.input_len)


def warmup(group: Group, row: Row) -> tuple[list[list[int]], int]:
    """A short warm-up before `row`'s timed runs: (prompts, max_tokens)."""
    return (_prompts(group, min(row.batch, 8), min(row.input_len, 512), WARMUP_SEED),
            min(row.output_len, 16))


def _prompts(group: Group, n: int, length: int, seed: int) -> list[list[int]]:
    specs = random_requests(n, (length, length), (1, 1), vocab_size(group.preset), seed)
    return [s.prompt for s in specs]
