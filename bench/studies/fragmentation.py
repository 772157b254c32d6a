"""KV fragmentation of each memory manager on the seeds' mixed workload (bookkeeping only).

Replays one workload through the real Scheduler and KV manager of every mode, with a stub
worker that samples a fixed token; no model runs, so this measures memory accounting, not
speed. Request lengths (prompt + max_tokens) follow the seeds' mix: 30% short (< 512), 60%
medium (512-2047), 10% long (2048-8191). max_tokens is a quarter of the length (16..512);
each request stops early, after 25-100% of max_tokens (a stop string: the api aborts it).

Internal fragmentation = 1 - live tokens / reserved slots, where reserved counts the slots
of held blocks (paged), regions (contiguous) or slots (token), and live the positions
holding KV. Reported at the peak of reserved memory and as a whole-run average (sum of
live over sum of reserved across steps). `stranded` (dynamic only) is free space inside
superblocks split for another size class: not reserved, but unusable by other classes.

    python -m bench.studies.fragmentation [--requests 300] [--slots 65536] [--out PREFIX]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from runtime.config.server import ServerConfig  # noqa: E402
from runtime.scheduler.loop import build_scheduler  # noqa: E402
from runtime.wire.sampling import SamplingParams  # noqa: E402
from runtime.wire.scheduler_input import GenerateReq  # noqa: E402
from runtime.wire.worker_channel import BatchPlan, StepResult, WorkerReady  # noqa: E402

MAX_CONTEXT = 8192
MIX = ((0.3, 32, 511), (0.6, 512, 2047), (0.1, 2048, MAX_CONTEXT - 1))  # share, min, max
MODES = {
    "token": {"kv": "token"},
    "paged-16": {"kv": "paged", "block_size": 16},
    "paged-32": {"kv": "paged", "block_size": 32},
    "paged-64": {"kv": "paged", "block_size": 64},
    "paged-dynamic": {"kv": "paged", "block_size": "dynamic"},
    "contiguous-request": {"kv": "contiguous", "reserve": "request"},
    "contiguous-max": {"kv": "contiguous", "reserve": "max"},
}


@dataclass(frozen=True)
class Spec:
    prompt: int
    max_tokens: int
    output: int  # tokens generated before the stop


@dataclass
class Result:
    mode: str
    frag_at_peak: float  # internal fragmentation when reserved slots peak
    frag_avg: float  # sum(live) / sum(reserved) over steps, as 1 - ratio
    peak_reserved: int
    live_at_peak: int
    stranded_at_peak: int
    peak_running: int
    steps: int
    retractions: int


def workload(n: int, seed: int) -> list[Spec]:
    rng = random.Random(seed)
    specs = []
    for _ in range(n):
        _, lo, hi = rng.choices(MIX, weights=[m[0] for m in MIX])[0]
        length = rng.randint(lo, hi)
        max_tokens = min(512, max(16, length // 4))
        output = rng.randint(max(1, max_tokens // 4), max_tokens)
        specs.append(Spec(length - max_tokens, max_tokens, output))
    return specs


def stub_step(plan: BatchPlan) -> StepResult:
    n = sum(plan.sample)
    return StepResult(plan.batch_id, [1] * n, [0.0] * n)


def replay(mode: str, specs: list[Spec], slots: int, max_running: int, seed: int) -> Result:
    cfg = ServerConfig(ipc_dir=tempfile.gettempdir(), chunk_size=8192, max_running=max_running,
                       **MODES[mode])
    ready = WorkerReady(kv_slots=slots, max_rows=max_running + 8, max_context=MAX_CONTEXT,
                        kv_bytes_per_token=0, device="none")
    sched = build_scheduler(cfg, ready, MAX_CONTEXT)
    rng = random.Random(seed)
    target = {}
    for i, spec in enumerate(specs):
        rid = f"r{i}"
        target[rid] = spec.output
        prompt = [rng.randrange(3, 50000) for _ in range(spec.prompt)]  # no shared prefixes
        sched.add(GenerateReq(rid=rid, input_ids=prompt, stop_ids=[],
                              params=SamplingParams(max_tokens=spec.max_tokens)))
    peak = (0, 0, 0)  # reserved, live, stranded
    sum_live = sum_reserved = peak_running = 0
    while sched.has_work:
        plan = sched.plan()
        assert plan is not None, f"{mode}: stalled"
        kv = sched.kv.stats()
        sum_live, sum_reserved = sum_live + kv.live, sum_reserved + kv.reserved
        peak = max(peak, (kv.reserved, kv.live, kv.used - kv.reserved))
        peak_running = max(peak_running, len(sched.running))
        sched.on_result(stub_step(plan))
        for req in list(sched.running):
            if len(req.output_ids) >= target[req.rid]:
                sched.finish(req.rid)
        sched.take_outputs()
    sched.check_invariants()
    reserved, live, stranded = peak
    return Result(mode, frag_at_peak=1 - live / reserved, frag_avg=1 - sum_live / sum_reserved,
                  peak_reserved=reserved, live_at_peak=live, stranded_at_peak=stranded,
                  peak_running=peak_running, steps=sched.num_steps,
                  retractions=sched.num_retractions)


def write_results(prefix: Path, meta: dict, results: list[Result]) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2) + "\n")
    lines = [
        "# KV fragmentation by memory manager (bookkeeping replay, no model)", "",
        f"{meta['requests']} requests, lengths {meta['mix']}, {meta['slots']} KV slots, "
        f"max_running {meta['max_running']}, seed {meta['seed']}. "
        "Internal fragmentation = 1 - live tokens / reserved slots.", "",
        "| mode | frag at peak | frag avg | peak reserved | live at peak | stranded at peak "
        "| peak running | steps | retractions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.mode} | {r.frag_at_peak:.2%} | {r.frag_avg:.2%} | {r.peak_reserved} "
                     f"| {r.live_at_peak} | {r.stranded_at_peak} | {r.peak_running} | {r.steps} "
                     f"| {r.retractions} |")
    prefix.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[5:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--slots", type=int, default=65536, help="KV pool size in tokens")
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    parser.add_argument("--out", default="bench/results/fragmentation", help="output path prefix")
    args = parser.parse_args()
    specs = workload(args.requests, args.seed)
    meta = {"requests": args.requests, "slots": args.slots, "max_running": args.max_running,
            "seed": args.seed, "mix": "30% 32-511, 60% 512-2047, 10% 2048-8191 tokens",
            "mean_length": sum(s.prompt + s.max_tokens for s in specs) / len(specs)}
    results = [replay(m, specs, args.slots, args.max_running, args.seed)
               for m in args.modes.split(",")]
    write_results(Path(args.out), meta, results)


if __name__ == "__main__":
    main()
