"""The scheduler's host time per decode step, with a stand-in worker.

    python -m bench.host.scheduler [--requests 1,64,256,512] [--contexts 512,2048,8192]
                                   [--modes token,paged] [--steps 64] [--profile]

Each point admits `requests` requests of `context` prompt tokens (distinct random ids,
no prefix sharing), prefills them, then times `steps` decode steps of the overlapped loop
as the scheduler process runs it: `plan` (plus encoding the `BatchPlan`), then
`on_result` of the oldest batch in flight (plus encoding the `BatchOut` for the api). The
stand-in worker answers at once with a fixed token, so the time is the scheduler's alone.
`--profile` adds a cProfile summary of the 256-request, longest-context token-mode point.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time
from collections import deque

import msgspec

from runtime.scheduler.paged_kv import PagedKV
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.token_kv import TokenKV
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.wire.worker_channel import StepResult

CHUNK = 65536  # prefill tokens per step while settling


def build(mode: str, requests: int, context: int, steps: int) -> Scheduler:
    # requests admitted early decode while later ones prefill: at most one token per step
    prefill_steps = requests * context // CHUNK + 2
    slots = requests * (context + steps + prefill_steps + 16) + 64
    rows = requests + 16
    kv = TokenKV(slots, rows) if mode == "token" else PagedKV(slots, rows, 16)
    sched = Scheduler(kv, chunk_size=CHUNK, max_running=requests,
                      max_context=context + steps + prefill_steps + 16, max_in_flight=2)
    sched.adder.ratio = sched.adder.init_ratio = sched.adder.min_ratio = 0.0
    rng = random.Random(0)
    params = SamplingParams(max_tokens=steps + prefill_steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(requests):
        prompt = [rng.randrange(10, 30000) for _ in range(context)]
        sched.add(GenerateReq(rid=f"r{i}", input_ids=prompt, params=params))
    return sched


class Driver:
    """Runs the overlapped loop: keep two batches in flight, answer the oldest at once."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.launched: deque = deque()
        self.enc = msgspec.msgpack.Encoder()
        self.plan_bytes = 0

    def step(self) -> None:
        sched = self.sched
        while sched.can_plan():
            plan = sched.plan()
            if plan is None:
                break
            self.plan_bytes = len(self.enc.encode(plan))
            self.launched.append(plan)
        plan = self.launched.popleft()
        n = sum(plan.sample)
        sched.on_result(StepResult(plan.batch_id, [11] * n, [0.0] * n))
        if batch := sched.take_batch():
            self.enc.encode(batch)

    def settle(self) -> None:
        """Step until every request decodes (prefill done)."""
        while any(r.in_prefill for r in self.sched.running) or self.sched.waiting:
            self.step()


def measure(mode: str, requests: int, context: int, steps: int,
            profile: cProfile.Profile | None = None) -> dict:
    sched = build(mode, requests, context, steps)
    drv = Driver(sched)
    drv.settle()
    for _ in range(4):  # steady state: two batches in flight
        drv.step()
    times = []
    if profile is not None:
        profile.enable()
    for _ in range(steps - 8):
        t0 = time.perf_counter()
        drv.step()
        times.append(time.perf_counter() - t0)
    if profile is not None:
        profile.disable()
    assert len(sched.running) == requests, "a request left the batch early"
    return dict(mode=mode, requests=requests, context=context,
                step_ms=round(statistics.median(times) * 1e3, 3),
                p90_ms=round(sorted(times)[int(0.9 * len(times))] * 1e3, 3),
                plan_bytes=drv.plan_bytes)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", default="1,64,256,512")
    p.add_argument("--contexts", default="512,2048,8192")
    p.add_argument("--modes", default="token,paged")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--profile", action="store_true")


def run_scheduler_bench(args: argparse.Namespace) -> dict:
    """Median scheduler ms per decode step for every (mode, requests, context) point."""
    ints = lambda s: [int(x) for x in s.split(",")]
    rows = []
    print(f"{'mode':>6} {'reqs':>5} {'context':>7} {'ms/step':>8} {'p90':>8} {'plan B':>7}",
          flush=True)
    for mode in args.modes.split(","):
        for requests in ints(args.requests):
            for context in ints(args.contexts):
                r = measure(mode, requests, context, args.steps)
                rows.append(r)
                print(f"{mode:>6} {requests:>5} {context:>7} {r['step_ms']:>8.3f} "
                      f"{r['p90_ms']:>8.3f} {r['plan_bytes']:>7}", flush=True)
    out = dict(rows=rows)
    if args.profile:
        prof = cProfile.Profile()
        measure("token", 256, max(ints(args.contexts)), args.steps, prof)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        out["profile"] = buf.getvalue()
        print(out["profile"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(p)
    run_scheduler_bench(p.parse_args())


if __name__ == "__main__":
    main()
