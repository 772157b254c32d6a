"""What `bench.studies.compare` runs: the KV modes, the workloads of each profile, and the
KV budget.

Request counts are sized for the time budget on an H200 with a 7B model: in the sweep each
client sends one ~2048-token request (1792 in + 256 out), so concurrency 100 and 150 already
exceed the ~130k-token pool of an 80 GiB budget (about 65 such sequences) and measure what
each mode does past its capacity: queue, retract, or refuse.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

GiB = 1 << 30
ACTIVATION_RESERVE = 1 * GiB  # as runtime/worker/model_runner.py reserves beside the pool
CONTEXT_RESERVE = 1 * GiB  # CUDA context, cuBLAS / Triton workspaces, CUDA graphs
ROW_SLACK = 16  # runtime/worker/worker.py: rows beyond max_running

# in run order: the first server compiles the Triton kernels (cached for the others), so the
# least important mode goes first
MODES: dict[str, list[str]] = {
    "token-no-overlap": ["--kv", "token", "--no-overlap"],
    "sglang": ["--kv", "token", "--overlap"],  # token KV, radix cache, overlap (SGLang-style)
    "paged": ["--kv", "paged", "--block-size", "16"],  # vLLM-style; sync loop by default
    # the articles' "paged + CPU offload" row: vLLM v0's swapping to a host tier
    "paged-swap": ["--kv", "paged", "--block-size", "16", "--preempt", "swap",
                   "--host-kv-gib", "{host_kv_gib}"],
    "sglang-hicache": ["--kv", "token", "--overlap", "--host-kv-gib", "{host_kv_gib}"],
    "contiguous": ["--kv", "contiguous", "--reserve", "request"],  # the seeds' "original"
    # `sglang` over an fp8 pool (a float32 scale per token and KV head): the same memory
    # budget holds ~1.9x the tokens (its slots are sized with the fp8 bytes per token)
    "sglang-fp8": ["--kv", "token", "--overlap", "--kv-dtype", "fp8"],
    # the same over an fp8 pool without scales (one of 1 for the whole tensor): 2x the tokens
    "sglang-fp8-e4m3": ["--kv", "token", "--overlap", "--kv-dtype", "fp8_e4m3"],
}


def mode_kv_dtype(mode: str) -> str:
    """The `--kv-dtype` a mode's server gets (`auto`: the model's dtype)."""
    args = MODES[mode]
    return args[args.index("--kv-dtype") + 1] if "--kv-dtype" in args else "auto"


@dataclass(frozen=True)
class Cell:
    """One workload: `n` requests of `dataset`, at most `concurrency` in flight."""

    name: str
    kind: str  # sweep | fixed | mixed | long | prefix: where the report puts it
    dataset: str
    n: int
    concurrency: int
    input_len: int = 0  # shared-prefix: the suffix
    output_len: int = 0  # mixed: the max_tokens cap
    rate: float = math.inf  # requests/s (Poisson); inf: all at once
    max_len: int = 0  # mixed: the longest request
    num_prefixes: int = 0
    prefix_len: int = 0
    weight: float = 1.0  # share of the mode's time
    seeds_concurrency: int = 0  # sweep: the seeds' concurrency this cell stands for

    def describe(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v or k == "name"}


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    dtype: str
    device: str
    cells: tuple[Cell, ...]
    time_budget: float  # seconds for the whole matrix
    gpu_memory_budget: str = "80GiB"
    kv_slots: int = 0  # set: use this pool size, not the budget
    host_kv_gib: float = 48.0  # the host tier of the modes that have one
    max_running: int = 256
    ready_timeout: float = 240.0
    warmup_timeout: float = 120.0
    frag_requests: int = 300
    server_args: tuple[str, ...] = ()
    vocab: int = field(default=0)
    max_context: int = field(default=0)

    def __post_init__(self) -> None:
        from runtime.model_presets import DUMMY_PRESETS

        preset = DUMMY_PRESETS[self.model.removeprefix("dummy:")]
        object.__setattr__(self, "vocab", preset["vocab_size"])
        object.__setattr__(self, "max_context", preset["max_position_embeddings"])

    def select(self, names: str | None) -> Profile:
        if not names:
            return self
        keep = names.split(",")
        unknown = set(keep) - {c.name for c in self.cells}
        if unknown:
            raise SystemExit(f"unknown cells {sorted(unknown)}; have "
                             f"{[c.name for c in self.cells]}")
        return dataclasses.replace(self, cells=tuple(c for c in self.cells if c.name in keep))


def _sweep(concurrency: tuple[int, ...], input_len: int, output_len: int,
           weights: tuple[float, ...]) -> tuple[Cell, ...]:
    return tuple(Cell(f"c{c}", "sweep", "fixed", c, c, input_len, output_len, weight=w,
                      seeds_concurrency=s)
                 for c, w, s in zip(concurrency, weights, (50, 100, 150)))


def customize(p: Profile, model: str | None = None, dtype: str | None = None,
              max_running: int | None = None, sweep: str | None = None) -> Profile:
    """`p` on another `dummy:` preset / dtype / `--max-running`, and with `sweep` ("50,100,800")
    its sweep cells replaced by one per concurrency (one request per client, the profile's
    sweep lengths; the seeds' 50 / 100 / 150 keep standing for theirs; a cell's share of the
    time grows with its concurrency, as the full profile's do)."""
    given = {"model": model, "dtype": dtype, "max_running": max_running}
    p = dataclasses.replace(p, **{k: v for k, v in given.items() if v})
    if not sweep:
        return p
    first = next(c for c in p.cells if c.kind == "sweep")
    cells = tuple(Cell(f"c{c}", "sweep", "fixed", c, c, first.input_len, first.output_len,
                       weight=0.2 + c / 50, seeds_concurrency=c if c in (50, 100, 150) else 0)
                  for c in map(int, sweep.split(",")))
    return dataclasses.replace(p, cells=cells + tuple(c for c in p.cells if c.kind != "sweep"))


FULL = Profile(
    "full", "dummy:llama-7b-32k", "float16", "cuda", time_budget=480, cells=(
        *_sweep((50, 100, 150), 1792, 256, (1.2, 2.2, 3.2)),
        Cell("fixed", "fixed", "fixed", 64, 64, 512, 128, weight=0.6),
        Cell("mixed", "mixed", "mixed", 64, 64, output_len=256, rate=16.0, max_len=8192,
             weight=1.2),
        Cell("long", "long", "long", 2, 2, 32000, 64, weight=1.0),
        Cell("prefix", "prefix", "shared-prefix", 64, 32, 128, 64, num_prefixes=4,
             prefix_len=1024, weight=0.6)))
QUICK = dataclasses.replace(
    FULL, name="quick", time_budget=300, cells=(
        *_sweep((50, 100, 150), 1920, 128, (1.0, 1.6, 2.2)),
        Cell("fixed", "fixed", "fixed", 64, 64, 512, 128, weight=0.5),
        Cell("mixed", "mixed", "mixed", 48, 48, output_len=128, rate=16.0, max_len=8192,
             weight=1.0),
        Cell("long", "long", "long", 1, 1, 16000, 32, weight=0.6),
        Cell("prefix", "prefix", "shared-prefix", 32, 16, 128, 32, num_prefixes=4,
             prefix_len=1024, weight=0.4)))
CPU_SMOKE = Profile(
    "cpu-smoke", "dummy:tiny", "float32", "cpu", time_budget=300, kv_slots=2048, host_kv_gib=0.1,
    ready_timeout=120, warmup_timeout=60, frag_requests=60,
    server_args=("--torch-threads", "1"), cells=(
        *_sweep((4, 8, 12), 200, 128, (1.0, 1.0, 1.0)),
        Cell("fixed", "fixed", "fixed", 8, 8, 64, 64),
        Cell("mixed", "mixed", "mixed", 24, 8, output_len=128, rate=20.0, max_len=1024),
        Cell("long", "long", "long", 1, 1, 1536, 32),
        Cell("prefix", "prefix", "shared-prefix", 8, 4, 32, 32, num_prefixes=2,
             prefix_len=256)))
PROFILES = {p.name: p for p in (FULL, QUICK, CPU_SMOKE)}


def parse_bytes(text: str) -> int:
    """`80GiB`, `80GB`, `512MiB` or a plain byte count."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " KMGT".index(m.group(2).upper() or " "))


def preset_bytes(model: str, dtype: str, kv_dtype: str = "auto") -> tuple[int, int]:
    """(weight bytes, KV bytes per token) of a model (a Llama, DeepSeek MLA or DeepSeek-V4
    preset) in `dtype`, its KV as the worker's pool stores it in `kv_dtype`
    (`runtime/worker/kv_pool.py`, one rank): Llama K and V of every KV head, DeepSeek one
    latent row (kv_lora_rank + qk_rope_head_dim values) a layer, each row with a float32
    scale when quantized (but for "fp8_e4m3"); DeepSeek-V4 its K=V row a layer and its
    share of the entry pools (`deepseek_v4_entries.v4_bytes_per_token`: "fp8" rows and
    entries with a scale each, 16-bit indexer keys), the larger of the token layout's and
    the default paged layout's (pages of 16)."""
    import torch

    from bench.roofline import ModelBytes
    from runtime.model_config import resolve_model
    from runtime.worker.kv_pool import (
        kv_bytes_per_token,
        kv_dtype_scaled,
        kv_storage_dtype,
    )
    from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
    from runtime.worker.models.deepseek_v4_entries import check_v4_kv_dtype, v4_bytes_per_token
    from runtime.worker.models.registry import model_class

    dt = getattr(torch, dtype)
    config = resolve_model(model).hf_config()
    stored = kv_storage_dtype(kv_dtype, dt)
    a = model_class(config).ARCH.from_hf(config)
    if isinstance(a, DeepseekV4Arch):  # a K=V row a layer, and the entry pools
        check_v4_kv_dtype(kv_dtype)
        kv = max(v4_bytes_per_token(a, dt, 1, True, kv_dtype),
                 v4_bytes_per_token(a, dt, 16, False, kv_dtype))
    elif hasattr(a, "latent_dim"):  # MLA: one latent row a layer
        kv = kv_bytes_per_token(a.num_layers, 1, a.latent_dim, stored, planes=1)
    else:
        kv = kv_bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, stored,
                                scaled=kv_dtype_scaled(kv_dtype))
    return ModelBytes.of(model, dt).params, kv


def row_state_bytes(model: str, dtype: str, rows: int) -> int:
    """Bytes a model keeps per request row beside the pool, for `rows` rows: DeepSeek-V4's
    partial-block rings (`deepseek_v4_partial.ring_values`), 0 for the others."""
    import torch

    from runtime.model_config import resolve_model
    from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
    from runtime.worker.models.deepseek_v4_partial import ring_values
    from runtime.worker.models.registry import model_class

    config = resolve_model(model).hf_config()
    a = model_class(config).ARCH.from_hf(config)
    if not isinstance(a, DeepseekV4Arch):
        return 0
    return rows * ring_values(a) * getattr(torch, dtype).itemsize


def budget_kv_slots(p: Profile, budget: int, kv_dtype: str = "auto") -> dict:
    """KV slots that fit `budget` bytes of GPU memory beside the weights and a reserve (and
    what the model keeps per request row), for a pool of `kv_dtype`."""
    weights, kv_per_token = preset_bytes(p.model, p.dtype, kv_dtype)
    rows = p.max_running + ROW_SLACK
    logits = 8 * rows * p.vocab * 4  # fp32 logits + sampler temporaries
    reserve = (ACTIVATION_RESERVE + CONTEXT_RESERVE + logits
               + row_state_bytes(p.model, p.dtype, rows))
    slots = max(0, (budget - weights - reserve) // kv_per_token)
    return {"budget_bytes": budget, "weight_bytes": weights, "reserve_bytes": reserve,
            "kv_bytes_per_token": kv_per_token, "kv_slots": int(slots), "kv_dtype": kv_dtype,
            "explain": f"({budget / GiB:.1f} GiB budget - {weights / GiB:.2f} GiB weights - "
                       f"{reserve / GiB:.2f} GiB activations/context) / "
                       f"{kv_per_token / 1024:.1f} KiB per token = {slots} slots "
                       f"= {slots // 2048} sequences of 2048 tokens"}
