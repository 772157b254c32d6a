"""The measured parts of `bench.offline`; each runs alone in its own process and returns a dict.

Sluice's engine, HF static `generate`, HF `generate_batch`, and in-process decode steps
through a `ModelRunner`. The workload is a `Preset`; every part builds the same prompts.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.probes.jit_compiles import compiled_since
from bench.roofline import BANDWIDTH, ModelBytes
from runtime.model_config import resolve_model


@dataclass(frozen=True)
class Preset:
    """The workload and how long to measure it."""

    model: str = "dummy:llama-7b"
    dtype: str = "float16"
    quantization: str = "none"  # Sluice's weights: none or fp8 (HF peers stay 16-bit)
    kv_dtype: str = "auto"  # Sluice's KV pool: auto (the model's dtype), fp8 or int8
    batch: int = 64
    input_len: int = 512
    output_len: int = 128
    seed: int = 0
    chunk_size: int = 8192  # Sluice: prefill tokens per step
    kv_slots: int = 0  # Sluice's KV pool; 0: from free memory (mem_fraction 0.85)
    repeats: int = 3  # timed engine generates; the median is reported
    warmup_reqs: int = 8
    warmup_tokens: int = 16
    step_batches: tuple[int, ...] = (1, 64, 256)
    step_iters: int = 30
    hf_block_size: int = 256  # generate_batch's page size (its default)
    torch_threads: int = 0
    timeout_s: int = 300  # per part


PRESETS = {
    "full": Preset(),
    "quick": Preset(repeats=1, step_iters=10),
    "tiny": Preset(model="dummy:tiny", dtype="float32", batch=4, input_len=32, output_len=8,
                   chunk_size=64, kv_slots=4096, repeats=2, warmup_reqs=2, warmup_tokens=2,
                   step_batches=(1, 4, 8), step_iters=3, hf_block_size=16, torch_threads=2,
                   timeout_s=240),
}  # fmt: skip


def prompts(p: Preset, run: int = 0) -> list[list[int]]:
    """Random prompts (ids >= 3: clear of bos/eos/unk); run 0's are every system's.

    Each engine run gets its own, so none hits the radix cache of an earlier one.
    """
    vocab = resolve_model(p.model).hf_config().vocab_size
    gen = torch.Generator().manual_seed(p.seed * 1_000_003 + run)
    return torch.randint(3, vocab, (p.batch, p.input_len), generator=gen).tolist()


def device_info() -> dict:
    import transformers
    import triton

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"device": name, "torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ------------------------------------------------------------------ Sluice engine
def part_engine(p: Preset, overlap: bool) -> dict:
    """Offline throughput with overlap on or off, and the worker's per-step device timing."""
    from runtime import Engine, SamplingParams
    from runtime.worker.step_timing import ENV

    timing = Path(tempfile.mkdtemp(prefix="sluice-bench-")) / "steps.jsonl"
    os.environ[ENV] = str(timing)  # the worker process the Engine spawns inherits it
    t0 = time.perf_counter()
    with Engine(model=p.model, dtype=p.dtype, quantization=p.quantization, overlap=overlap,
                chunk_size=p.chunk_size, kv_dtype=p.kv_dtype,
                kv_slots=p.kv_slots, max_running=max(p.batch, 64), torch_threads=p.torch_threads,
                seed=p.seed, log_level="warning") as eng:
        start_s = time.perf_counter() - t0
        warm = SamplingParams(max_tokens=p.warmup_tokens, temperature=0.0, ignore_eos=True)
        eng.generate(prompts(p, p.repeats)[: p.warmup_reqs], warm)
        params = SamplingParams(max_tokens=p.output_len, temperature=0.0, ignore_eos=True)
        runs, cached, runs_t0 = [], 0, time.time()
        for run in range(p.repeats):
            batch = prompts(p, run)
            time.sleep(0.5)  # the previous generate's trailing batch lands in the log first
            first = len(_read_steps(timing))
            t0 = time.perf_counter()
            outs = eng.generate(batch, params)
            wall = time.perf_counter() - t0
            tokens = sum(len(o.token_ids) for o in outs)
            assert tokens == p.batch * p.output_len, f"{tokens} tokens generated"
            cached += sum(o.cached_tokens for o in outs)
            time.sleep(0.5)
            runs.append((wall, _read_steps(timing)[first:]))
        stats = eng.stats()
    walls = sorted(w for w, _ in runs)
    wall = walls[len(walls) // 2]
    return {"overlap": overlap, "engine_start_s": start_s, "wall_s": wall,
            "tok_s": p.batch * p.output_len / wall,
            "all_tok_s": [p.batch * p.output_len / w for w, _ in runs],
            "steps_per_run": [len(s) for _, s in runs], "engine_steps_total": stats.num_steps,
            "kv_slots": stats.kv_total, "retractions": stats.num_retractions,
            "prefix_cached_tokens": cached, "compiled_in_runs": compiled_since(runs_t0),
            "step_log_last_run": runs[-1][1],  # the worker's per-step lines, for a closer look
            "idle": idle_stats([s for _, s in runs])}


def _read_steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def idle_stats(runs: list[list[dict]]) -> dict:
    """Device idle gap before each decode step that follows a decode step, over all runs."""
    gaps, steps = [], []
    for log in runs:
        for prev, cur in zip(log, log[1:]):
            if prev["decode"] and cur["decode"] and cur["gap_ms"] is not None:
                gaps.append(cur["gap_ms"])
                steps.append(cur["step_ms"])
    if not gaps:
        return {"pairs": 0}
    gs, ss = sorted(gaps), sorted(steps)
    return {"pairs": len(gaps), "median_gap_ms": gs[len(gs) // 2],
            "mean_gap_ms": sum(gaps) / len(gaps), "p90_gap_ms": gs[int(0.9 * (len(gs) - 1))],
            "max_gap_ms": gs[-1], "median_step_ms": ss[len(ss) // 2],
            "mean_step_ms": sum(steps) / len(steps), "idle_pct": 100 * sum(gaps) / sum(steps)}


# ------------------------------------------------------------------ HF transformers peers
def _hf_model(p: Preset):
    """A transformers Llama of the same config, randomly initialized on the device."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(p.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(resolve_model(p.model).hf_config(),
                                                 dtype=getattr(torch, p.dtype))
    return model.eval(), device


def part_hf_static(p: Preset) -> dict:
    """transformers `generate` on the whole batch at once, greedy, exactly output_len tokens."""
    model, device = _hf_model(p)
    ids = torch.tensor(prompts(p), device=device)  # [B, L]
    kw = dict(do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        warm = ids[:, :16]
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=2, **kw)
        _sync()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=p.output_len, min_new_tokens=p.output_len, **kw)
        _sync()
        wall = time.perf_counter() - t0
    assert out.shape == (p.batch, p.input_len + p.output_len), tuple(out.shape)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"wall_s": wall, "tok_s": p.batch * p.output_len / wall, "peak_gib": peak}


def part_hf_batch(p: Preset) -> dict:
    """transformers `generate_batch` (continuous batching, paged KV), its warm-up included."""
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    model, _ = _hf_model(p)
    gen = GenerationConfig(max_new_tokens=p.output_len, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=p.hf_block_size)
    batch = prompts(p)
    _sync()
    t0 = time.perf_counter()  # not under inference_mode: generate_batch fails there
    out = model.generate_batch(inputs=batch, generation_config=gen, continuous_batching_config=cb)
    _sync()
    wall = time.perf_counter() - t0
    assert len(out) == p.batch, f"{len(out)} of {p.batch} requests came back"
    counted = all(hasattr(o, "generated_tokens") for o in out.values())
    tokens = (sum(len(o.generated_tokens) for o in out.values()) if counted
              else p.batch * p.output_len)  # eos_token_id=-1: it cannot stop early
    return {"wall_s": wall, "tok_s": tokens / wall, "tokens": tokens, "counted": counted,
            "block_size": p.hf_block_size}


# ------------------------------------------------------------------ decode steps
def step_batch(ids: torch.Tensor, prefix: int, stride: int, seq0: int = 0,
               decode: bool = False):  # fmt: skip
    """One step of every row of ids `[B, S]` (sequences seq0 ...) after `prefix` cached
    tokens, one sample a sequence (its last); sequence s holds slots 1 + s * stride ...,
    contiguous as the token pool hands them to a fresh prefill (slot 0 stays the padding
    sink). prefix 0: the prefill that fills those caches; decode (S = 1): a decode step."""
    from runtime.worker.forward_batch import ForwardBatch

    b, s = ids.shape
    dev = ids.device
    i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
    first = (torch.arange(b, **i64) + seq0) * stride + 1  # [B] each sequence's first slot
    seq = prefix + s
    return ForwardBatch(
        input_ids=ids.flatten(),  # [B*S]
        positions=torch.arange(prefix, seq, **i64).repeat(b),  # [B*S]
        out_slots=(first[:, None] + torch.arange(prefix, seq, **i64)).flatten(),  # [B*S]
        qo_indptr=torch.arange(b + 1, **i32) * s,  # [B+1]
        kv_indptr=torch.arange(b + 1, **i32) * seq,  # [B+1]
        kv_indices=(first[:, None] + torch.arange(seq, **i64)).flatten(),  # [B*seq]
        seq_lens=torch.full((b,), seq, **i32), prefix_lens=torch.full((b,), prefix, **i32),
        sample_idx=torch.arange(b, **i64) * s + s - 1,  # [B]
        is_decode=decode, seq_lens_cpu=[seq] * b, prefix_lens_cpu=[prefix] * b,
        extend_lens_cpu=[s] * b)  # fmt: skip


def decode_batch(batch: int, ctx: int, vocab: int, device: torch.device):
    """A decode step of `batch` sequences of `ctx` positions each (the new token's included),
    sequence s in slots 1 + s*ctx ... (`step_batch`)."""
    ids = torch.randint(3, vocab, (batch, 1), dtype=torch.int64, device=device)  # [B, 1]
    return step_batch(ids, ctx - 1, ctx, decode=True)


def time_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of `fn()`: CUDA events around each call on a GPU, else the clock."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[iters // 2]
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in events)[iters // 2]


def part_steps(p: Preset) -> dict:
    """Decode forward at each batch size (graph replay, and eager) against the floor.

    The context is input_len + output_len / 2, the mean over the offline workload's decode.
    Timed is `ModelRunner.forward` (copy into the graph's buffers, replay, logits), without
    the sampler and the token table that an engine step adds.
    """
    from runtime.worker.model_runner import ModelRunner

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, p.dtype)
    ctx = p.input_len + p.output_len // 2
    top = max(p.step_batches)
    runner = ModelRunner(resolve_model(p.model), device, dtype, kv_slots=top * ctx,
                         max_rows=top, seed=p.seed, cuda_graph=True,
                         quantization=p.quantization)
    for cache in runner.kv_pool.k + runner.kv_pool.v:  # finite, non-zero values, as in a run
        cache.normal_()
    sizes = ModelBytes.of(p.model, dtype, p.quantization)
    rows = []
    for b in p.step_batches:
        fb = decode_batch(b, ctx, runner.vocab_size, device)
        graph_ms = None
        if runner.graphs is not None and runner.graphs.can_run(fb):
            graph_ms = time_ms(lambda fb=fb: runner.forward(fb), p.step_iters)
        graphs, runner.graphs = runner.graphs, None  # the same step without CUDA graphs
        eager_ms = time_ms(lambda fb=fb: runner.forward(fb), max(3, p.step_iters // 3))
        runner.graphs = graphs
        weights, kv = sizes.step(b, ctx)
        best = graph_ms if graph_ms is not None else eager_ms
        floor_ms = sizes.floor_ms(b, ctx)
        rows.append({"batch": b, "context": ctx, "graph_ms": graph_ms, "eager_ms": eager_ms,
                     "weights_gb": weights / 1e9, "kv_gb": kv / 1e9, "floor_ms": floor_ms,
                     "x_floor": best / floor_ms, "tb_s": (weights + kv) / best / 1e9,
                     "pct_bandwidth": 100 * (weights + kv) / (best / 1e3) / BANDWIDTH})
    return {"rows": rows}


PARTS = {
    "steps": part_steps,
    "hf_static": part_hf_static,
    "hf_batch": part_hf_batch,
    "sluice_overlap": lambda p: part_engine(p, True),
    "sluice_no_overlap": lambda p: part_engine(p, False),
}
