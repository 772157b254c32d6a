"""Host path, worker part: the worker's host time per decode step, and where it goes.

Drives a `runtime.worker.worker.Worker` in-process (no scheduler, no sockets) with synthetic
BatchPlans: a prefill of `concurrency` requests of `input_len` tokens, then decode steps of
all of them together, each step's input the token the previous one sampled (placeholder ids,
as the overlap scheduler sends). Like the scheduler, it keeps two steps in flight: it
launches step i, then waits for step i-1's result, so the device never waits for the host.

- `launch_ms`: the host time of `Worker.launch` (perf_counter; no device sync around it);
- its split, timed by wrapping the calls `launch` makes (`PHASES`: build the inputs, the
  forward or graph replay, sampling, the copies of sampled ids to the host); `other` is the
  rest of `launch`; `handoff_ms` is putting the launched step on the sender's queue;
- `device_step_ms`: the step's device time from the worker's SLUICE_STEP_TIMING marks;
- `profile`: the functions with the most host time over a few more steps (cProfile).
"""

from __future__ import annotations

import cProfile
import gc
import os
import pstats
import queue
import tempfile
import time
from collections.abc import Callable

from bench.host.e2e import Budget, fmt, step_summary
from bench.serving.metrics import percentile

# (phase, dotted path from the Worker, or "module:<path>" for a name in worker.py);
# a path the worker does not have is reported in `phases_missing`
PHASES = (("build", "builder.build"), ("forward", "runner.forward"),
          ("sample", "runner.sampler.sample"), ("record", "builder.record"),
          ("to_host", "module:StepOutput.to_host"))
WARM_STEPS = 8
PROFILE_STEPS = 8
PROFILE_TOP = 12


def make_plan(**fields):
    """A BatchPlan from the fields this bench sets; fields the BatchPlan no longer has are
    dropped, the others keep their defaults (the one place to adapt if BatchPlan changes)."""
    from runtime.wire.worker_channel import BatchPlan

    known = set(BatchPlan.__struct_fields__)
    return BatchPlan(**{k: v for k, v in fields.items() if k in known})


class SyntheticLoad:
    """`n` requests on rows 0..n-1; position p of request r lives in KV slot 1 + r*stride + p
    (slot 0 is the padding sink). The worker runs in token mode, where a page is one slot,
    so a plan's `new_pages` are the slots of its new positions."""

    def __init__(self, n: int, input_len: int, decode_steps: int, vocab: int) -> None:
        self.n, self.input_len, self.vocab = n, input_len, vocab
        self.stride = input_len + decode_steps + 1
        self.kv_slots = n * self.stride

    def prefill_plans(self, chunk_tokens: int) -> list:
        """Whole prompts, as many requests per plan as fit in `chunk_tokens`; each samples."""
        from runtime.wire.sampling import SamplingParams
        from runtime.wire.worker_channel import RowInit

        params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
        per_plan = max(1, chunk_tokens // self.input_len)
        plans = []
        for first in range(0, self.n, per_plan):
            rows = list(range(first, min(self.n, first + per_plan)))
            plans.append(make_plan(
                batch_id=len(plans), rows=rows, prefix_lens=[0] * len(rows),
                extend_lens=[self.input_len] * len(rows),
                input_ids=[3 + (r * 7919 + p) % (self.vocab - 3)
                           for r in rows for p in range(self.input_len)],
                new_pages=[1 + r * self.stride + p for r in rows for p in range(self.input_len)],
                sample=[True] * len(rows), inits=[RowInit(row=r, params=params) for r in rows]))
        return plans

    def decode_plan(self, batch_id: int, step: int):
        """Decode step `step` (0-based) of every request, fed the rows' last sampled tokens."""
        pos = self.input_len + step
        rows = list(range(self.n))
        return make_plan(batch_id=batch_id, rows=rows, prefix_lens=[pos] * self.n,
                         extend_lens=[1] * self.n, input_ids=[-(r + 1) for r in rows],
                         new_pages=[1 + r * self.stride + pos for r in rows],
                         sample=[True] * self.n)


class PhaseTimer:
    """Wraps the calls named in PHASES with host timers, summed per step; restores them."""

    def __init__(self, worker, worker_module) -> None:
        self.spent: dict[str, float] = {}
        self.missing: list[str] = []
        self._undo: list[Callable[[], None]] = []
        for phase, path in PHASES:
            owner, name = self._resolve(worker, worker_module, path)
            if owner is None:
                self.missing.append(phase)
                continue
            self._wrap(owner, name, phase)

    @staticmethod
    def _resolve(worker, module, path: str):
        owner = worker
        if path.startswith("module:"):
            owner, path = module, path.split(":", 1)[1]
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        return (owner, name) if callable(getattr(owner, name, None)) else (None, name)

    def _wrap(self, owner, name: str, phase: str) -> None:
        original = getattr(owner, name)
        had_own = name in vars(owner)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original) if had_own
                          else delattr(owner, name))

    def take(self) -> dict[str, float]:
        """Milliseconds per phase since the last call."""
        out = {k: v * 1e3 for k, v in self.spent.items()}
        self.spent = {}
        return out

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()


def _summary(values: list[float]) -> dict:
    return {"p50": percentile(values, 50), "p90": percentile(values, 90),
            "mean": sum(values) / len(values) if values else None}


def _build_worker(model: str, args, load: SyntheticLoad, step_file: str):
    """A Worker on `args.device` with a pool that holds the synthetic load exactly."""
    from runtime.config.server import ServerConfig
    from runtime.model_config import resolve_model
    from runtime.worker.worker import Worker

    cfg = ServerConfig(model=model, device=args.device, dtype=args.dtype,
                       max_running=load.n, kv_slots=load.kv_slots, log_level="warning",
                       torch_threads=args.torch_threads)
    os.environ["SLUICE_STEP_TIMING"] = step_file  # read once, by the Worker's constructor
    try:
        worker = Worker(cfg, resolve_model(model))
    finally:
        del os.environ["SLUICE_STEP_TIMING"]
    if worker.device.type == "cuda" and hasattr(worker, "warm_up"):
        worker.warm_up()
    return worker


def _complete(worker, inflight) -> None:
    """Wait for a launched step's result and log its device time (as the sender thread does)."""
    inflight.result()
    timer, timing = getattr(worker, "timer", None), getattr(inflight, "timing", None)
    if timer is not None and timing is not None:
        timer.log(inflight.batch_id, timing)


def _decode(worker, load: SyntheticLoad, first_id: int, steps: range, on_step=None) -> None:
    """Launch decode `steps` two in flight; `on_step(launch_s, handoff_s)` after each launch."""
    sender: queue.Queue = queue.Queue()
    for i, step in enumerate(steps):
        plan = load.decode_plan(first_id + i, step)
        t0 = time.perf_counter()
        inflight = worker.launch(plan)
        t1 = time.perf_counter()
        sender.put(inflight)  # the hand-off to the sender thread of the real loop
        t2 = time.perf_counter()
        if on_step is not None:
            on_step(t1 - t0, t2 - t1)
        if i > 0:  # step i-1 completes while step i is queued behind it
            _complete(worker, sender.get())
    while not sender.empty():
        _complete(worker, sender.get())


def bench_model(model: str, args) -> dict:
    """One model's worker row (see the module docstring)."""
    import runtime.worker.worker as worker_module
    from runtime.model_config import resolve_model
    from runtime.model_presets import DUMMY_PRESETS

    spec = resolve_model(model)
    vocab = DUMMY_PRESETS[spec.dummy_preset]["vocab_size"] if spec.dummy_preset else 32000
    steps = args.worker_steps
    load = SyntheticLoad(args.e2e_concurrency, args.e2e_input_len,
                         WARM_STEPS + steps + PROFILE_STEPS, vocab)
    with tempfile.TemporaryDirectory() as tmp:
        step_file = os.path.join(tmp, "steps.jsonl")
        t0 = time.perf_counter()
        worker = _build_worker(model, args, load, step_file)
        start_s = time.perf_counter() - t0
        for plan in load.prefill_plans(args.worker_prefill_tokens):
            _complete(worker, worker.launch(plan))
        _decode(worker, load, 1000, range(WARM_STEPS))
        offset = os.path.getsize(step_file) if os.path.exists(step_file) else 0
        phases = PhaseTimer(worker, worker_module)
        launch, handoff, split = [], [], []

        def on_step(launch_s: float, handoff_s: float) -> None:
            launch.append(launch_s * 1e3)
            handoff.append(handoff_s * 1e3)
            split.append(phases.take())

        try:
            _decode(worker, load, 2000, range(WARM_STEPS, WARM_STEPS + steps), on_step)
        finally:
            phases.restore()
        device = step_summary(step_file, offset)
        profiler = cProfile.Profile()
        with profiler:
            _decode(worker, load, 3000, range(WARM_STEPS + steps,
                                              WARM_STEPS + steps + PROFILE_STEPS))
        del worker
    names = [p for p, _ in PHASES if p not in phases.missing]
    parts = {p: _summary([s.get(p, 0.0) for s in split]) for p in names}
    other = [ms - sum(s.values()) for ms, s in zip(launch, split)]
    return {"model": model, "batch": load.n, "steps": steps, "start_s": start_s,
            "launch_ms": _summary(launch), "handoff_ms": _summary(handoff),
            "phases_ms": {**parts, "other": _summary(other)}, "phases_missing": phases.missing,
            "device_step_ms_p50": device.get("step_ms_p50"),
            "device_gap_ms_p50": device.get("gap_ms_p50"),
            "logged_host_ms_p50": device.get("host_ms_p50"),  # the worker's own clock
            "device_busy": device.get("busy"), "profile": _top(profiler, PROFILE_STEPS)}


def _top(profiler: cProfile.Profile, steps: int) -> list[dict]:
    """The PROFILE_TOP functions with the most own host time, in ms per step."""
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:PROFILE_TOP]
    return [{"function": f"{os.path.basename(file)}:{line}({name})", "calls_per_step": nc / steps,
             "own_ms": tt * 1e3 / steps, "cumulative_ms": ct * 1e3 / steps}
            for (file, line, name), (_, nc, tt, ct, _) in rows]


def run_worker_bench(args, emit: Callable[[str, dict, str], None]) -> dict:
    """Every model of `--e2e-models`; `emit("worker", result so far, line)` after each."""
    import torch

    budget = Budget(args.deadline)
    rows = []
    for model in args.e2e_models.split(","):
        row = {"model": model, **budget.run(bench_model, model, args)}
        gc.collect()  # the worker's tensors, before the next model's
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        rows.append(row)
        emit("worker", {"rows": rows}, _row_line(row))
    return {"rows": rows}


def _row_line(row: dict) -> str:
    if "error" in row:
        return f"worker {row['model']}: {row['error']}"
    return (f"worker {row['model']}: launch {row['launch_ms']['p50']:.3f} ms p50 host, device "
            f"step {fmt(row['device_step_ms_p50'], '.3f')} ms p50, busy "
            f"{fmt(row['device_busy'], '.1%')}")


def markdown(result: dict) -> list[str]:
    """The worker table: host ms per decode step (p50) by phase, against the device step."""
    names = [p for p, _ in PHASES] + ["other"]
    lines = ["Host time of `Worker.launch` per decode step (p50, ms; no device sync), split by "
             "the calls it makes; the device step from SLUICE_STEP_TIMING. host/device < 1: "
             "the host keeps ahead of the GPU.", "",
             "| model | batch | launch | " + " | ".join(names) + " | hand-off | device step | "
             "host/device |", "|---|---:|---:|" + "---:|" * (len(names) + 3)]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |")
            continue
        launch, dev = r["launch_ms"]["p50"], r["device_step_ms_p50"]
        split = " | ".join(fmt(r["phases_ms"].get(n, {}).get("p50"), ".3f") for n in names)
        lines.append(f"| {r['model']} | {r['batch']} | {launch:.3f} | {split} | "
                     f"{r['handoff_ms']['p50']:.3f} | {fmt(dev, '.3f')} | "
                     f"{fmt(launch / dev if dev else None)} |")
    for r in result["rows"]:
        if r.get("profile"):
            top = ", ".join(f"`{p['function']}` {p['own_ms']:.3f}" for p in r["profile"][:6])
            lines += ["", f"{r['model']}, most host time (cProfile, own ms per step): {top}"]
    return lines
